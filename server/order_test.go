package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/dispatcher"
)

// TestJobsLeaveInTheOrderGiven holds PRODUCT.md guarantee 12 through the
// API: three producers, each on its own connections, send batches and
// single jobs into one flow (one tenant, lane and partition) at once, and
// a worker sending one request at a time must send each producer's jobs in
// the order that producer enqueued them, every job of a batch included.
// (Enqueuing a batch's items concurrently once let them take their FIFO
// places in whatever order they reached Redis.)
func TestJobsLeaveInTheOrderGiven(t *testing.T) {
	if testing.Short() {
		t.Skip("three producers and a worker for seconds: runs in make test")
	}
	f := newFixture(t, generous, 0)
	const producers, batch = 3, 40
	// Each producer sends: a batch, a single, a batch, two singles.
	plan := []int{batch, 1, batch, 1, 1}
	perProducer := 0
	for _, n := range plan {
		perProducer += n
	}
	total := producers * perProducer

	var mu sync.Mutex
	var sent []string
	done := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		sent = append(sent, r.URL.Path)
		if len(sent) == total {
			close(done)
		}
		mu.Unlock()
		w.WriteHeader(200)
	}))
	defer up.Close()

	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A client of its own: its own connections to the API.
			hc := &http.Client{Transport: &http.Transport{}}
			defer hc.CloseIdleConnections()
			n := 0
			job := func() string {
				s := fmt.Sprintf(`{"upstream":"stripe","path":"/o/%d/%d"}`, p, n)
				n++
				return s
			}
			for _, size := range plan {
				path, body := "/v1/jobs", job()
				if size > 1 {
					items := []string{body}
					for range size - 1 {
						items = append(items, job())
					}
					path, body = "/v1/jobs/batch", `{"jobs":[`+strings.Join(items, ",")+`]}`
				}
				req, _ := http.NewRequest("POST", f.hs.URL+path, strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer billing-secret")
				req.Header.Set("Content-Type", "application/json")
				resp, err := hc.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				if resp.StatusCode != 202 && resp.StatusCode != 200 {
					t.Errorf("producer %d: %s answered %d", p, path, resp.StatusCode)
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	stripe, _ := f.q.Upstream("stripe")
	stripe.BaseURL, stripe.Concurrency = up.URL, 1
	d, err := dispatcher.New(f.rdb, dispatcher.Config{Upstreams: []shaper.Upstream{stripe}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- d.Run(ctx) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Errorf("sent %d of %d jobs in 60 s", len(sent), total)
	}
	stop()
	if err := <-ran; err != nil {
		t.Errorf("Run: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	next := make([]int, producers)
	for i, path := range sent {
		var p, n int
		if _, err := fmt.Sscanf(path, "/o/%d/%d", &p, &n); err != nil || p < 0 || p >= producers {
			t.Fatalf("send %d: unexpected path %q", i, path)
		}
		if n != next[p] {
			t.Fatalf("send %d was %s: got job %d of producer %d, want %d (first sends: %v)", i, path, n, p, next[p], sent[:min(len(sent), 12)])
		}
		next[p]++
	}
}
