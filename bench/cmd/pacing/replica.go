package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/shaperhq/shaper/leaky"
)

// replicaEnv marks a child process as a replica, so that its arguments are
// the replica's and not the command's.
const replicaEnv = "SHAPER_BENCH_PACING_REPLICA"

// The limiters under test.
const (
	limiterShaper = "shaper"
	limiterNaive  = "naive"
)

// replicaOptions is what a parent tells one replica.
type replicaOptions struct {
	limiter    string
	redis      string
	bucket     string
	rate       int64
	per        time.Duration
	workers    int
	start, end time.Time
}

func (o replicaOptions) args() []string {
	return []string{
		"-limiter", o.limiter, "-redis", o.redis, "-bucket", o.bucket,
		"-rate", strconv.FormatInt(o.rate, 10), "-per", o.per.String(),
		"-workers", strconv.Itoa(o.workers),
		"-start", strconv.FormatInt(o.start.UnixNano(), 10), "-end", strconv.FormatInt(o.end.UnixNano(), 10),
	}
}

func parseReplicaFlags(args []string) (replicaOptions, error) {
	fs := flag.NewFlagSet("pacing replica", flag.ContinueOnError)
	var o replicaOptions
	var start, end int64
	fs.StringVar(&o.limiter, "limiter", "", "shaper or naive")
	fs.StringVar(&o.redis, "redis", "", "redis address")
	fs.StringVar(&o.bucket, "bucket", "", "leaky bucket name")
	fs.Int64Var(&o.rate, "rate", 0, "sends per -per")
	fs.DurationVar(&o.per, "per", time.Second, "window of the limit")
	fs.IntVar(&o.workers, "workers", 1, "sending goroutines")
	fs.Int64Var(&start, "start", 0, "start, Unix ns")
	fs.Int64Var(&end, "end", 0, "end, Unix ns")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.start, o.end = time.Unix(0, start), time.Unix(0, end)
	return o, nil
}

// replicaReport is everything a replica prints, line by line:
//
//	send <unix ns> <lateness ns>
//	late <slots skipped by leaky.ErrLate>
//	refused <reservations refused for a wait beyond MaxWait>
type replicaReport struct {
	sends    []time.Time
	lateness []time.Duration
	late     int
	refused  int
}

func (r *replicaReport) write(w io.Writer) error {
	bw := bufio.NewWriter(w)
	for i, t := range r.sends {
		fmt.Fprintf(bw, "send %d %d\n", t.UnixNano(), r.lateness[i].Nanoseconds())
	}
	fmt.Fprintf(bw, "late %d\nrefused %d\n", r.late, r.refused)
	return bw.Flush()
}

func parseReplicaReport(out []byte) (*replicaReport, error) {
	r := &replicaReport{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		var err error
		switch {
		case len(f) == 3 && f[0] == "send":
			var ns, late int64
			if ns, err = strconv.ParseInt(f[1], 10, 64); err == nil {
				late, err = strconv.ParseInt(f[2], 10, 64)
			}
			r.sends = append(r.sends, time.Unix(0, ns))
			r.lateness = append(r.lateness, time.Duration(late))
		case len(f) == 2 && f[0] == "late":
			r.late, err = strconv.Atoi(f[1])
		case len(f) == 2 && f[0] == "refused":
			r.refused, err = strconv.Atoi(f[1])
		default:
			err = errors.New("unknown line")
		}
		if err != nil {
			return nil, fmt.Errorf("replica printed %q: %v", line, err)
		}
	}
	return r, nil
}

// sender is one goroutine's loop: it returns when the replica's end comes,
// having recorded its sends in rec.
type sender func(ctx context.Context, rec *replicaReport) error

// runReplica sends as fast as its limiter lets it from the agreed start to
// the agreed end, then prints what it did. Nothing is printed while sending,
// so that writing cannot delay a send.
func runReplica(ctx context.Context, args []string, out io.Writer) error {
	o, err := parseReplicaFlags(args)
	if err != nil {
		return err
	}
	var send sender
	switch o.limiter {
	case limiterShaper:
		rdb := redis.NewClient(&redis.Options{Addr: o.redis, PoolSize: o.workers + 2})
		defer rdb.Close()
		b, err := leaky.New(rdb, leaky.Config{}).Bucket(o.bucket, leaky.BucketConfig{
			Limits: []leaky.Limit{{Rate: o.rate, Per: o.per}},
		})
		if err != nil {
			return err
		}
		// Dial every connection the workers will use before the start,
		// as a long-running worker would have them already.
		var wg sync.WaitGroup
		for range o.workers {
			wg.Go(func() { rdb.Ping(ctx) })
		}
		wg.Wait()
		send = shaperSender(b)
	case limiterNaive:
		lim := rate.NewLimiter(rate.Limit(float64(o.rate)/o.per.Seconds()), 1)
		send = naiveSender(lim)
	default:
		return fmt.Errorf("-limiter %q: want %s or %s", o.limiter, limiterShaper, limiterNaive)
	}
	if ahead := time.Until(o.start); ahead < 0 {
		return fmt.Errorf("ready %v after the agreed start: the machine is too busy to start replicas in time", -ahead)
	}
	time.Sleep(time.Until(o.start))
	ctx, cancel := context.WithDeadline(ctx, o.end)
	defer cancel()

	recs := make([]replicaReport, o.workers)
	errs := make([]error, o.workers)
	var wg sync.WaitGroup
	for i := range o.workers {
		wg.Go(func() { errs[i] = send(ctx, &recs[i]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	var all replicaReport
	for _, r := range recs {
		all.sends = append(all.sends, r.sends...)
		all.lateness = append(all.lateness, r.lateness...)
		all.late += r.late
		all.refused += r.refused
	}
	return all.write(out)
}

// shaperSender is Bucket.Take taken apart, so that late slots can be
// counted: reserve, wait for the slot, send; a slot woken up for too late
// (leaky.ErrLate) is skipped and reserved again, as Take would.
func shaperSender(b *leaky.Bucket) sender {
	return func(ctx context.Context, rec *replicaReport) error {
		for {
			r, err := b.Reserve(ctx, nil)
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				return err
			}
			if !r.OK {
				rec.refused++
				if !sleep(ctx, max(r.RetryAfter, 100*time.Microsecond)) {
					return nil
				}
				continue
			}
			err = r.Wait(ctx)
			sent := time.Now()
			switch {
			case err == nil:
			case errors.Is(err, leaky.ErrLate):
				rec.late++
				continue
			case ctx.Err() != nil:
				return nil
			default:
				return err
			}
			rec.sends = append(rec.sends, sent)
			rec.lateness = append(rec.lateness, sent.Sub(r.SendAt()))
		}
	}
}

// naiveSender is what rate.Limiter.Wait does, with the slot it waits for
// kept so that lateness can be measured against it.
func naiveSender(lim *rate.Limiter) sender {
	return func(ctx context.Context, rec *replicaReport) error {
		for {
			now := time.Now()
			r := lim.ReserveN(now, 1)
			slot := now.Add(r.DelayFrom(now))
			if !sleep(ctx, slot.Sub(now)) {
				r.CancelAt(time.Now())
				return nil
			}
			sent := time.Now()
			rec.sends = append(rec.sends, sent)
			rec.lateness = append(rec.lateness, sent.Sub(slot))
		}
	}
}

// sleep waits d and reports whether ctx is still live afterwards.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
