package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/bench/internal/redisproc"
	"github.com/shaperhq/shaper/leaky"
)

type options struct {
	n       int
	workers int
	limits  int
}

func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("overrides", flag.ContinueOnError)
	var o options
	fs.IntVar(&o.n, "n", 100_000, "partitions given limits of their own")
	fs.IntVar(&o.workers, "workers", 32, "goroutines setting them")
	fs.IntVar(&o.limits, "limits", 1, "limits per override: 1 (requests per minute) or 2 (and tokens per minute)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.n < 1000:
		return o, fmt.Errorf("-n %d: must be at least 1000 (fewer and fixed costs swamp the figure)", o.n)
	case o.workers < 1:
		return o, fmt.Errorf("-workers %d: must be at least 1", o.workers)
	case o.limits != 1 && o.limits != 2:
		return o, fmt.Errorf("-limits %d: want 1 or 2", o.limits)
	}
	return o, nil
}

func run(ctx context.Context, args []string, out io.Writer) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	srv, err := redisproc.Start()
	if err != nil {
		return err
	}
	defer srv.Stop()
	// One connection measures; the writers' pool is closed before the
	// second reading, so its buffers are not counted.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 1})
	defer rdb.Close()
	wdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: o.workers})
	cfg := leaky.BucketConfig{Limits: []leaky.Limit{leaky.PerSecond(100)}}
	b, err := leaky.New(rdb, leaky.Config{}).Bucket("shaper.mail", cfg)
	if err != nil {
		return err
	}
	wb, err := leaky.New(wdb, leaky.Config{}).Bucket("shaper.mail", cfg)
	if err != nil {
		return err
	}
	ls := []leaky.Limit{{Rate: 1000, Per: time.Minute}}
	if o.limits == 2 {
		ls = append(ls, leaky.Limit{Rate: 400_000, Per: time.Minute, Cost: "tokens"})
	}
	// One override first, so the record and the hash exist before the
	// baseline: what follows is per override only.
	if err := b.PutPartitionLimits(ctx, name(-1), ls); err != nil {
		return err
	}
	before, err := settled(srv)
	if err != nil {
		return err
	}
	start := time.Now()
	work := make(chan int)
	errs := make(chan error, o.workers)
	var wg sync.WaitGroup
	for range o.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := wb.PutPartitionLimits(ctx, name(i), ls); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := 0; i < o.n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	took := time.Since(start)
	wdb.Close()
	after, err := settled(srv)
	if err != nil {
		return err
	}
	layout := b.Layout()
	hash := layout.PartitionPrefix[:len(layout.PartitionPrefix)-len("p:")] + "pov"
	usage, err := rdb.MemoryUsage(ctx, hash).Result()
	if err != nil {
		return err
	}
	enc, err := rdb.ObjectEncoding(ctx, hash).Result()
	if err != nil {
		return err
	}
	// The lookup the take makes for a job's partition: one HGET.
	const lookups = 20_000
	t0 := time.Now()
	for i := 0; i < lookups; i++ {
		if err := rdb.HGet(ctx, hash, name(i*7919%o.n)).Err(); err != nil {
			return fmt.Errorf("lookup: %w", err)
		}
	}
	per := time.Since(t0) / lookups
	got, _, err := b.ReadPartitionLimits(ctx, name(o.n-1))
	if err != nil || len(got) != len(ls) {
		return fmt.Errorf("read back: got %v, %v", got, err)
	}
	fmt.Fprintf(out, "Partition overrides on %s: %d partitions (names like %q) given %d limit(s) each (%s), %d workers, in %v.\n\n",
		srv.Version, o.n, name(0), len(ls), describe(ls), o.workers, took.Round(time.Millisecond))
	fmt.Fprintf(out, "| overrides | used_memory growth | per override | MEMORY USAGE of the hash | encoding | HGET round trip (the take's lookup) |\n")
	fmt.Fprintf(out, "|---|---|---|---|---|---|\n")
	fmt.Fprintf(out, "| %d | %.1f MB | %.0f B | %.1f MB | %s | %v |\n", o.n, float64(after-before)/1e6,
		float64(after-before)/float64(o.n), float64(usage)/1e6, enc, per.Round(time.Microsecond))
	return nil
}

func name(i int) string { return fmt.Sprintf("customer-%06d.example.com", i+1) }

func describe(ls []leaky.Limit) string {
	s := ""
	for i, l := range ls {
		if i > 0 {
			s += ", "
		}
		s += l.String()
	}
	return s
}

// settled is used_memory once only our client is connected and it stopped
// moving (Redis grows a hash table a step at a time).
func settled(srv *redisproc.Server) (int64, error) {
	deadline := time.Now().Add(5 * time.Second)
	prev := int64(-1)
	for {
		clients, err := srv.Info("clients")
		if err != nil {
			return 0, err
		}
		used, err := srv.UsedMemory()
		if err != nil {
			return 0, err
		}
		// Ours, and the one that asked.
		if n, _ := strconv.Atoi(clients["connected_clients"]); n <= 2 && used == prev {
			return used, nil
		}
		if time.Now().After(deadline) {
			return used, nil
		}
		prev = used
		time.Sleep(100 * time.Millisecond)
	}
}
