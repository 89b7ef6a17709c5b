package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// producer enqueues jobs through `POST /v1/jobs` at a fixed rate, open
// loop: job i is due at start + i/rate whatever became of the ones before,
// as independent clients would send them. Senders take due jobs from a
// queue one second deep; when every sender is busy and that queue is full,
// the producer falls behind its schedule and Lag says by how much.
type producer struct {
	url    string
	key    string
	rate   int
	run    string // this run's tag in idempotency keys
	client *http.Client

	due      atomic.Int64 // jobs scheduled so far
	sent     atomic.Int64 // jobs taken by a sender
	enqueued atomic.Int64 // answered 202
	refused  atomic.Int64 // answered anything else, or failed

	mu       sync.Mutex
	byAnswer map[string]int64 // refusals by status code or error
	firstErr string
}

// senders is how many requests may be in flight at once.
const senders = 32

// jobBody is job i: a JSON POST of about 100 bytes with an idempotency key.
func jobBody(run string, i int64) []byte {
	return fmt.Appendf(nil, `{"upstream":"api","method":"POST","path":"/v1/orders","headers":{"Content-Type":"application/json"},`+
		`"body":"{\"order\":\"ord_%012d\",\"amount\":1999,\"currency\":\"eur\",\"note\":\"soak test order, padding to 100 bytes..\"}",`+
		`"idempotency_key":"soak-%s-%d"}`, i, run, i)
}

// start runs the producer until ctx ends, then waits for requests in
// flight; it returns at once, and done is closed when it has stopped.
func (p *producer) start(ctx context.Context) (done chan struct{}) {
	p.byAnswer = map[string]int64{}
	jobs := make(chan int64, p.rate)
	var wg sync.WaitGroup
	for range senders {
		wg.Go(func() {
			for i := range jobs {
				p.send(i)
			}
		})
	}
	done = make(chan struct{})
	go func() {
		defer close(done)
		defer wg.Wait()
		defer close(jobs)
		t0 := time.Now()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		var next int64
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			due := int64(time.Since(t0).Seconds() * float64(p.rate))
			p.due.Store(due)
			for ; next < due; next++ {
				select {
				case jobs <- next:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return done
}

func (p *producer) send(i int64) {
	p.sent.Add(1)
	req, err := http.NewRequest(http.MethodPost, p.url, bytes.NewReader(jobBody(p.run, i)))
	if err != nil {
		p.refuse(err.Error())
		return
	}
	req.Header.Set("Authorization", "Bearer "+p.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.client.Do(req)
	if err != nil {
		p.refuse(err.Error())
		return
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode == http.StatusAccepted {
		p.enqueued.Add(1)
		return
	}
	p.refuse(fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(body)))
}

func (p *producer) refuse(why string) {
	p.refused.Add(1)
	key := why
	if len(key) > 3 && key[3] == ' ' {
		key = key[:3] // a status code
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.byAnswer[key]++
	if p.firstErr == "" {
		p.firstErr = why
	}
}

// lag is how many due jobs no sender has taken yet.
func (p *producer) lag() int64 { return max(0, p.due.Load()-p.sent.Load()) }

// refusals summarises what refused jobs were answered, and the first
// answer in full.
func (p *producer) refusals() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.byAnswer) == 0 {
		return "none"
	}
	return fmt.Sprintf("%v (first: %.300s)", p.byAnswer, p.firstErr)
}
