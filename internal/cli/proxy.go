package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/shaperhq/shaper/config"
)

// runAPI serves the API on ln, and each upstream with proxy.listen at the
// root of its own listener, with the API's background work (the proxy's
// drain counts and block announcements), until ctx ends or a listener
// fails; then it shuts them all down and waits for them.
func runAPI(ctx context.Context, parts *apiParts, cfg *config.Config, ln net.Listener, grace time.Duration, log *slog.Logger) error {
	srv := parts.server
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var lns []net.Listener
	var names []string
	for _, name := range cfg.UpstreamNames() {
		u := cfg.Upstreams[name].Shaper()
		h := srv.ProxyHandler(name)
		if u.Proxy.Listen == "" || h == nil {
			continue
		}
		pl, err := net.Listen("tcp", u.Proxy.Listen)
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			ln.Close()
			return fmt.Errorf("upstreams.%s.proxy.listen: listen on %s: %w", name, u.Proxy.Listen, err)
		}
		log.Info("proxy listening", "upstream", name, "addr", pl.Addr().String())
		lns, names = append(lns, pl), append(names, name)
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(lns)+1)
	wg.Add(2 + len(lns))
	go func() {
		defer wg.Done()
		srv.Run(ctx)
	}()
	go func() {
		defer wg.Done()
		errs <- serveUntilDone(ctx, ln, srv.Handler(), parts.q.EndWaits, grace, log)
		cancel()
	}()
	for i, pl := range lns {
		go func() {
			defer wg.Done()
			errs <- serveUntilDone(ctx, pl, srv.ProxyHandler(names[i]), nil, grace, log)
			cancel()
		}()
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}
