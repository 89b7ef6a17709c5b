package cli

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// TestWorkSendsJobs starts `shaper work` on a Redis holding a job enqueued
// through package queue: the worker sends it and records it succeeded.
func TestWorkSendsJobs(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	sent := make(chan string, 10)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent <- r.URL.Path
		w.Write([]byte("ok"))
	}))
	defer up.Close()
	cfg := writeFile(t, "work.yaml", `
redis: {url: "`+srv.URL()+`"}
upstreams:
  sendco:
    base_url: `+up.URL+`
    limits: [{rate: 100, per: 1s}]
`)
	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{{Name: "sendco", Limits: []leaky.Limit{leaky.PerSecond(100)}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	job, _, err := q.Enqueue(ctx, &queue.Job{Tenant: "t1", Upstream: "sendco", Method: "POST", Path: "/v1/send"})
	if err != nil {
		t.Fatal(err)
	}

	var errOut bytes.Buffer
	f := &Factory{In: strings.NewReader(""), Out: io.Discard, ErrOut: &errOut,
		LookupEnv: func(string) (string, bool) { return "", false }}
	root := NewRootCmd(f)
	root.SetArgs([]string{"work", "--config", cfg, "--metrics-listen", "off"})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(runCtx) }()
	select {
	case p := <-sent:
		if p != "/v1/send" {
			t.Errorf("sent %s, want /v1/send", p)
		}
	case err := <-done:
		stop()
		t.Fatalf("work ended before sending the job: %v\n%s", err, errOut.String())
	case <-time.After(15 * time.Second):
		stop()
		<-done
		t.Fatalf("the job was not sent\n%s", errOut.String())
	}
	// Let the worker record the outcome, then stop it.
	var info *queue.Info
	for range 200 {
		if info, err = q.Get(ctx, job.ID, ""); err == nil && info.State == queue.StateSucceeded {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("work: %v", err)
	}
	if err != nil || info.State != queue.StateSucceeded {
		t.Errorf("the job after the worker: %+v, %v; want succeeded", info, err)
	}
}
