package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// hookSink receives the jobs' callbacks (with -callbacks): each job's
// callback_url is /hook/INDEX, and the sink counts per job the deliveries
// (every one answered 204) and whether they all carried one webhook-id.
type hookSink struct {
	hs  *http.Server
	url string
	t0  time.Time

	got      []atomic.Int32 // deliveries per job index
	settled  atomic.Int64   // jobs with at least one
	attempts atomic.Int64
	lastNew  atomic.Int64 // ns since t0 of the latest first delivery

	mu        sync.Mutex
	ids       map[int]string // the first webhook-id per job
	mismatch  int            // deliveries of a job under another id than its first
	unsigned  int            // deliveries without the three headers
	notParsed int            // paths that name no job
}

func startHookSink(jobs int, t0 time.Time) (*hookSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &hookSink{url: "http://" + ln.Addr().String(), t0: t0, got: make([]atomic.Int32, jobs), ids: map[int]string{}}
	h.hs = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go h.hs.Serve(ln)
	return h, nil
}

func (h *hookSink) host() string { return strings.TrimPrefix(h.url, "http://") }

func (h *hookSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	h.attempts.Add(1)
	i, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/hook/"))
	id := r.Header.Get("webhook-id")
	h.mu.Lock()
	switch {
	case err != nil || i < 0 || i >= len(h.got):
		h.notParsed++
	case id == "" || r.Header.Get("webhook-timestamp") == "" || !strings.HasPrefix(r.Header.Get("webhook-signature"), "v1,"):
		h.unsigned++
	default:
		if first, ok := h.ids[i]; !ok {
			h.ids[i] = id
		} else if first != id {
			h.mismatch++
		}
	}
	h.mu.Unlock()
	if err == nil && i >= 0 && i < len(h.got) && h.got[i].Add(1) == 1 {
		h.settled.Add(1)
		h.lastNew.Store(int64(time.Since(h.t0)))
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *hookSink) close() { h.hs.Close() }

// webhookSecret is a fresh Standard Webhooks secret.
func webhookSecret() string {
	b := make([]byte, 32)
	rand.Read(b)
	return "whsec_" + base64.StdEncoding.EncodeToString(b)
}

// callbackResult is what the callbacks of a run came to.
type callbackResult struct {
	// Owed counts accepted jobs that reached a final state (so owe a
	// callback): the jobs the upstream answered 2xx.
	Owed int `json:"owed"`
	// Lost counts owed callbacks never delivered within the wait,
	// Duplicates the jobs delivered more than once, Extra the deliveries
	// beyond the first.
	Lost       int   `json:"lost"`
	Duplicates int   `json:"duplicate_jobs"`
	Extra      int   `json:"extra_deliveries"`
	Attempts   int64 `json:"deliveries"`
	// IDMismatch counts deliveries of a job under another webhook-id than
	// its first; Unsigned those missing a Standard Webhooks header.
	IDMismatch int `json:"webhook_id_mismatches"`
	Unsigned   int `json:"unsigned"`
	// LastAt is when the last first delivery arrived, since the workers
	// started; Waited how long after the queue emptied the run waited.
	LastAt time.Duration `json:"last_first_delivery_at_ns"`
	Waited time.Duration `json:"waited_ns"`
}

// waitCallbacks waits (up to wait) until every job the upstream answered
// 2xx has had its callback delivered, then counts.
func (c *chaos) waitCallbacks(ctx context.Context, wait time.Duration) *callbackResult {
	owed := func() (owed, pending int) {
		for i := range c.up.oks {
			if c.prod.ids[i] != "" && c.up.oks[i].Load() > 0 {
				owed++
				if c.hooks.got[i].Load() == 0 {
					pending++
				}
			}
		}
		return owed, pending
	}
	start := time.Now()
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		n, pending := owed()
		if pending == 0 || time.Since(start) > wait || ctx.Err() != nil {
			c.note("callbacks: %d of %d owed delivered (%d deliveries)", n-pending, n, c.hooks.attempts.Load())
			break
		}
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	r := &callbackResult{Attempts: c.hooks.attempts.Load(), LastAt: time.Duration(c.hooks.lastNew.Load()) - c.t0.Sub(c.hooks.t0),
		Waited: time.Since(start)}
	for i := range c.up.oks {
		got := int(c.hooks.got[i].Load())
		if c.prod.ids[i] != "" && c.up.oks[i].Load() > 0 {
			r.Owed++
			if got == 0 {
				r.Lost++
			}
		}
		if got > 1 {
			r.Duplicates++
			r.Extra += got - 1
		}
	}
	c.hooks.mu.Lock()
	r.IDMismatch, r.Unsigned = c.hooks.mismatch, c.hooks.unsigned
	c.hooks.mu.Unlock()
	return r
}

func writeCallbacks(w io.Writer, r *callbackResult) {
	if r == nil {
		return
	}
	fmt.Fprintf(w, "| callbacks owed (delivered jobs with a `callback_url`) | %d |\n", r.Owed)
	fmt.Fprintf(w, "| **callbacks lost** (owed, never delivered) | **%d** (%s) |\n", r.Lost, pct(r.Lost, r.Owed))
	fmt.Fprintf(w, "| **callbacks delivered twice or more** | **%d** jobs, %d extra deliveries (%s of owed); %d deliveries in all |\n",
		r.Duplicates, r.Extra, pct(r.Duplicates, r.Owed), r.Attempts)
	fmt.Fprintf(w, "| callbacks under another `webhook-id` than the job's first / without the Standard Webhooks headers | %d / %d |\n", r.IDMismatch, r.Unsigned)
	fmt.Fprintf(w, "| last first callback at | %.1f s (waited %.1f s after the queue emptied) |\n", r.LastAt.Seconds(), r.Waited.Seconds())
}
