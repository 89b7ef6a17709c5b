package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/client"
	"github.com/shaperhq/shaper/internal/testsupport/apicheck"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/server"
	"github.com/shaperhq/shaper/status"
	"github.com/shaperhq/shaper/tokenbucket"
)

func TestCallbackURLTravels(t *testing.T) {
	in := client.JobRequest{Upstream: "stripe", Path: "/x", CallbackURL: "https://hooks.example.com/done"}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out client.JobRequest
	if err := json.Unmarshal(b, &out); err != nil || out.CallbackURL != in.CallbackURL {
		t.Fatalf("round trip of %s: got %+v, %v", b, out, err)
	}
}

// Against a real server allowing one host: a job with a callback shows it,
// and RetryCallback of a callback not failed is a conflict.
func TestRetryCallback(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a server on a real redis-server")
	}
	rdb := redistest.New(t).Client(t)
	ups := []shaper.Upstream{{Name: "stripe", BaseURL: "https://api.stripe.com", Limits: []leaky.Limit{leaky.PerSecond(100)},
		ResultRetention: time.Hour, DeadRetention: time.Hour}}
	q, err := queue.New(rdb, queue.Config{Upstreams: ups})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	st, err := status.NewReader(rdb, q, "")
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.New(rdb, q, st, server.Config{Keys: []server.Key{{Name: "billing", Secret: "billing-secret"}},
		Admission: tokenbucket.Limit{Capacity: 100, Refill: 100, Per: time.Second}, CallbackHosts: []string{"hooks.example.com"},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	chk, err := apicheck.New()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(hs.URL, "billing-secret", client.WithHTTPClient(chk.Client(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	job, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe", Path: "/x", NotBefore: time.Now().Add(time.Hour), CallbackURL: "https://hooks.example.com/done"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cancel(ctx, job.ID); err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(ctx, job.ID)
	if err != nil || got.CallbackURL != "https://hooks.example.com/done" || got.Callback == nil || got.Callback.State != "pending" {
		t.Fatalf("Get: got %+v, %v; want the callback pending", got, err)
	}
	if _, err := c.RetryCallback(ctx, job.ID); !errors.Is(err, client.ErrConflict) {
		t.Fatalf("RetryCallback of a pending callback: got %v, want ErrConflict", err)
	}
	if _, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe", Path: "/x", CallbackURL: "https://evil.example/x"}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("Enqueue to a host not allowed: got %v, want ErrInvalid", err)
	}
}
