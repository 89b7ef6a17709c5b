// Command bulkemail is a paced bulk e-mail worker: jobs for the upstream
// "mail" are run by a Go function instead of an HTTP call, with the same
// fleet-wide pacing, retries and metrics as any upstream. Run several copies
// and together they still send no more than the limit.
//
//	go run ./examples/bulkemail -redis redis://localhost:6379/0 -enqueue 50
//
// Instead of talking SMTP it prints each message; replace send with your
// mail library. A Permanent error (a bounced address) kills the job at once;
// Pushback (the relay said "421 slow down") pauses every replica.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/dispatcher"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// message is what a job's body carries.
type message struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
}

func main() {
	redisURL := flag.String("redis", "redis://localhost:6379/0", "Redis URL")
	rate := flag.Int64("rate", 5, "messages per second, across all copies of this worker")
	enqueue := flag.Int("enqueue", 0, "enqueue this many test messages first")
	flag.Parse()
	if err := run(*redisURL, *rate, *enqueue); err != nil {
		fmt.Fprintln(os.Stderr, "bulkemail:", err)
		os.Exit(1)
	}
}

func run(redisURL string, rate int64, n int) error {
	opts, err := redis.ParseURL(redisURL)
	if err != nil {
		return err
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	// One description of the relay serves the queue and the dispatcher.
	mail := shaper.Upstream{
		Name:   "mail",
		Limits: []leaky.Limit{leaky.PerSecond(rate)},
		// Relays also cap connections; so do we, across every replica.
		Concurrency:     3,
		MaxPending:      100000,
		Retry:           shaper.Retry{MaxAttempts: 5, MinBackoff: time.Second, MaxBackoff: time.Minute},
		ResultRetention: time.Hour,
		DeadRetention:   24 * time.Hour,
	}
	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{mail}})
	if err != nil {
		return err
	}
	defer q.Close()
	for i := 0; i < n; i++ {
		body, _ := json.Marshal(message{To: fmt.Sprintf("user%d@example.com", i), Subject: "Your weekly report"})
		if _, _, err := q.Enqueue(ctx, &queue.Job{Upstream: "mail", Task: "send", Body: body}); err != nil {
			return err
		}
	}

	d, err := dispatcher.New(rdb, dispatcher.Config{
		Upstreams: []shaper.Upstream{mail},
		Logger:    slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
	if err != nil {
		return err
	}
	err = d.Handle("mail", func(ctx context.Context, job *queue.Job) (*queue.Response, error) {
		var m message
		if err := json.Unmarshal(job.Body, &m); err != nil {
			return nil, dispatcher.Permanent(fmt.Errorf("bad message: %w", err))
		}
		if err := send(ctx, m); err != nil {
			return nil, err
		}
		return &queue.Response{Status: 250, Body: []byte("queued for " + m.To)}, nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "sending at %d/s; Ctrl-C to stop\n", rate)
	return d.Run(ctx)
}

// send stands in for an SMTP client.
func send(ctx context.Context, m message) error {
	if !strings.Contains(m.To, "@") {
		return dispatcher.Permanent(errors.New("550 no such mailbox"))
	}
	fmt.Printf("%s  to=%s  subject=%q\n", time.Now().Format("15:04:05.000"), m.To, m.Subject)
	return nil
}
