package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// producer enqueues the jobs through `POST /v1/jobs/batch`, as a client
// that retries would: a request that fails, or items answered 5xx or 429,
// are sent again (with the same idempotency keys, so nothing is enqueued
// twice) a bounded number of times.
type producer struct {
	o      options
	client *http.Client
	url    string

	// ids holds the job id of every accepted job by index, "" for the rest.
	// Each index is written by one goroutine; read it after run returns.
	ids      []string
	accepted atomic.Int64
	// hookURL, with -callbacks, is every job's callback_url but for its
	// index at the end.
	hookURL string
	resent  atomic.Int64 // items sent again after a failure

	mu      sync.Mutex
	refused map[string]int // last answer of jobs never accepted, e.g. "503" or "request: EOF"
}

// Bounds on the producer's retries: with Redis down for a while, a batch
// is tried for about half a minute.
const (
	maxSends    = 20
	resendPause = 250 * time.Millisecond
	maxPause    = 2 * time.Second
)

func (p *producer) acceptedCount() int { return int(p.accepted.Load()) }

func (p *producer) run(ctx context.Context) {
	var next atomic.Int64
	batches := (p.o.jobs + p.o.batch - 1) / p.o.batch
	var wg sync.WaitGroup
	for range p.o.producers {
		wg.Go(func() {
			for {
				b := int(next.Add(1)) - 1
				if b >= batches || ctx.Err() != nil {
					return
				}
				lo := b * p.o.batch
				hi := min(lo+p.o.batch, p.o.jobs)
				p.send(ctx, lo, hi)
			}
		})
	}
	wg.Wait()
}

// jobBody is one job: a small POST whose idempotency key is its index,
// with a callback_url of hookURL and its index unless hookURL is "".
func jobBody(i int, hookURL string) string {
	n := strconv.Itoa(i)
	cb := ""
	if hookURL != "" {
		cb = `,"callback_url":"` + hookURL + n + `"`
	}
	return `{"upstream":"` + upstreamName + `","method":"POST","path":"/v1/things/` + n +
		`","headers":{"Content-Type":"application/json"},"body":"{\"n\":` + n + `}","idempotency_key":"` + keyPrefix + n + `"` + cb + `}`
}

type batchAnswer struct {
	Results []struct {
		Index  int `json:"index"`
		Status int `json:"status"`
		Job    struct {
			ID string `json:"id"`
		} `json:"job"`
	} `json:"results"`
}

// send enqueues jobs lo to hi-1 and records which were accepted.
func (p *producer) send(ctx context.Context, lo, hi int) {
	todo := make([]int, 0, hi-lo)
	for i := lo; i < hi; i++ {
		todo = append(todo, i)
	}
	last := map[int]string{}
	pause := resendPause
	for attempt := 1; len(todo) > 0 && attempt <= maxSends && ctx.Err() == nil; attempt++ {
		if attempt > 1 {
			p.resent.Add(int64(len(todo)))
			select {
			case <-ctx.Done():
			case <-time.After(pause):
			}
			pause = min(2*pause, maxPause)
		}
		var body bytes.Buffer
		body.WriteString(`{"jobs":[`)
		for k, i := range todo {
			if k > 0 {
				body.WriteByte(',')
			}
			body.WriteString(jobBody(i, p.hookURL))
		}
		body.WriteString(`]}`)
		ans, err := p.post(ctx, body.Bytes())
		if err != nil {
			for _, i := range todo {
				last[i] = "request: " + firstLine(err.Error())
			}
			continue
		}
		var again []int
		answered := make([]bool, len(todo))
		for _, r := range ans.Results {
			if r.Index < 0 || r.Index >= len(todo) {
				continue
			}
			i := todo[r.Index]
			answered[r.Index] = true
			switch {
			// 200: the key was already there, from an earlier send whose
			// answer was lost; the job exists all the same.
			case (r.Status == http.StatusAccepted || r.Status == http.StatusOK) && r.Job.ID != "":
				p.ids[i] = r.Job.ID
				p.accepted.Add(1)
				delete(last, i)
			case r.Status == http.StatusTooManyRequests || r.Status >= 500:
				last[i] = strconv.Itoa(r.Status)
				again = append(again, i)
			default:
				last[i] = strconv.Itoa(r.Status)
			}
		}
		for k, ok := range answered {
			if !ok {
				last[todo[k]] = "no result for the item"
			}
		}
		todo = again
	}
	if len(last) > 0 {
		p.mu.Lock()
		for _, why := range last {
			p.refused[why]++
		}
		p.mu.Unlock()
	}
}

func (p *producer) post(ctx context.Context, body []byte) (*batchAnswer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+apiKey)
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("batch answered %d: %.200s", resp.StatusCode, data)
	}
	var ans batchAnswer
	if err := json.Unmarshal(data, &ans); err != nil {
		return nil, fmt.Errorf("batch answer: %w", err)
	}
	return &ans, nil
}
