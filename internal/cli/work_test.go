package cli

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime/debug"
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

// TestStartRefusesUnknownAsynq: serve, work and dev refuse to start, before
// reading anything else, in a binary linking an asynq whose layout the
// store does not know, and say what to do.
func TestStartRefusesUnknownAsynq(t *testing.T) {
	good := writeFile(t, "good.yaml", strings.ReplaceAll(goodConfig, "%REDIS%", "redis://127.0.0.1:1/0"))
	newer := func() []*debug.Module {
		return []*debug.Module{{Path: "github.com/hibiken/asynq", Version: "v0.27.0"}}
	}
	for _, args := range [][]string{
		{"serve", "--config", good},
		{"work", "--config", good, "--metrics-listen", "off"},
		{"dev", "--listen", "127.0.0.1:0"},
	} {
		t.Run(args[0], func(t *testing.T) {
			var out, errOut bytes.Buffer
			f := &Factory{In: strings.NewReader(""), Out: &out, ErrOut: &errOut, BuildDeps: newer,
				LookupEnv: func(k string) (string, bool) { return "ops-secret", k == "OPS_KEY" }}
			code := f.execute(context.Background(), args)
			want := "shaper: refusing to start: this binary links github.com/hibiken/asynq v0.27.0, but shaper's store knows the Redis layout of asynq v0.26.0 only; build it with github.com/hibiken/asynq v0.26.0 (go get github.com/hibiken/asynq@v0.26.0)"
			if code != 1 || !strings.Contains(errOut.String(), want) {
				t.Errorf("exit %d, stderr %q; want 1 and %q", code, errOut.String(), want)
			}
			if out.Len() != 0 {
				t.Errorf("stdout %q, want nothing", out.String())
			}
		})
	}
}
