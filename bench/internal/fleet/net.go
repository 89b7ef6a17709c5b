package fleet

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"
)

// FreePort is a loopback port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// WaitReady polls http://addr/readyz until it answers 200. It gives up,
// with p's log, if p exits or 30 s pass, and returns ctx's error if ctx
// ends first.
func WaitReady(ctx context.Context, client *http.Client, addr string, p *Proc) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if p.Exited() || time.Now().After(deadline) {
			return fmt.Errorf("%s not ready on %s; log:\n%s", p.Name, addr, p.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
