package script

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Batcher coalesces concurrent calls so they share Redis round trips. Redis
// runs small scripts several times faster when they arrive together than one
// round trip at a time, and admission traffic is many small decisions at once.
//
// It is group commit without a background goroutine: a caller that finds
// fewer than MaxInFlight batches running leads at once, taking every call
// waiting at that moment, so a lone caller never waits for company. Callers
// that arrive while MaxInFlight batches run queue up; when a batch ends, its
// leader hands the lead to the oldest waiting caller, who takes the whole
// queue with it. Every goroutine involved is a caller's own, so there is
// nothing to start or stop.
//
// The zero value is not usable; build one with NewBatcher.
type Batcher[Q, R any] struct {
	run         func(ctx context.Context, calls []*Call[Q, R])
	maxBatch    int
	maxInFlight int
	waitSent    bool
	even        bool

	mu       sync.Mutex
	pending  []*Call[Q, R]
	inFlight int
	waiting  int // calls in pending still waiting
	running  int // calls in running batches
}

// Call is one caller's request in a batch. The batch function sets Res or
// Err on every call it is given.
type Call[Q, R any] struct {
	Req Q
	Res R
	Err error

	state    callState      // guarded by Batcher.mu
	wake     chan callState // for waiting callers only: one token, leading or done
	deadline time.Time      // the caller's context's, zero for none
}

type callState uint8

const (
	waiting   callState = iota // queued in pending
	leading                    // counted in inFlight; runs the next batch
	taken                      // in a running batch
	done                       // Res and Err are final
	abandoned                  // the caller's context ended first
)

// BatchOptions shape a Batcher. Zero values are the documented defaults.
type BatchOptions struct {
	// MaxBatch bounds how many calls share one round trip; zero means 128.
	// Bigger batches hold Redis longer in one script without saving much more.
	MaxBatch int
	// MaxInFlight bounds how many batches run at once; zero means 2. One
	// batch in flight leaves Redis idle while the client reads replies and
	// writes the next batch; two overlap those, and more only split the
	// queue into smaller batches.
	MaxInFlight int
	// WaitSent makes a caller whose context ends while its call is in a
	// running batch wait for that batch (bounded by its deadlines, see
	// NewBatcher) and get its result, so that what the call did in Redis
	// is known to the caller and can be undone (a booked slot given back).
	// Without it Do returns ctx.Err() at once, as for a call not yet sent.
	WaitSent bool
	// EvenBatches makes a caller who finds batches running wait for
	// company even when a round trip is free: a batch starts beside
	// running ones only once it would hold at least a MaxInFlight-th of
	// all the calls in the Batcher (those waiting and those running), or
	// MaxBatch calls. When nothing runs, the waiting calls go at once, so
	// a lone caller still never waits, and no call waits longer than the
	// batches running when it came. Without it, the first caller back
	// from a batch that ended finds the round trip free and takes it
	// nearly alone, and the others wait a whole round trip behind it: at
	// many callers, half the batches are a few calls, each costing Redis
	// a round trip.
	EvenBatches bool
}

// ErrBatchPanicked is what the other calls of a batch get when the batch
// function panicked in their leader's goroutine.
var ErrBatchPanicked = errors.New("batch function panicked")

// NewBatcher returns a Batcher that runs batches with run. A caller who
// finds a round trip free and nobody waiting runs a batch of its own call
// on its own context. Otherwise run receives the leader's context without
// its cancellation, because the batch serves other callers too, but with
// the latest of the batch's callers' deadlines (none if any caller has
// none): a batch outlives no caller's patience, so a Redis that hangs
// cannot hold a leader past every deadline in its batch. Each caller still
// stops waiting when its own context ends.
func NewBatcher[Q, R any](opts BatchOptions, run func(ctx context.Context, calls []*Call[Q, R])) *Batcher[Q, R] {
	b := &Batcher[Q, R]{run: run, maxBatch: opts.MaxBatch, maxInFlight: opts.MaxInFlight, waitSent: opts.WaitSent, even: opts.EvenBatches}
	if b.maxBatch <= 0 {
		b.maxBatch = 128
	}
	if b.maxInFlight <= 0 {
		b.maxInFlight = 2
	}
	return b
}

// Do runs req in the next batch and returns its result. When ctx ends
// before the result arrives, Do returns ctx.Err(); if the request was
// already sent it may still take effect in Redis, unless WaitSent is set:
// then a request already in a running batch waits for its result.
func (b *Batcher[Q, R]) Do(ctx context.Context, req Q) (R, error) {
	b.mu.Lock()
	if b.inFlight < b.maxInFlight && len(b.pending) == 0 && b.readyLocked(1) {
		b.inFlight++
		b.running++
		b.mu.Unlock()
		return b.alone(ctx, req)
	}
	c := &Call[Q, R]{Req: req}
	c.deadline, _ = ctx.Deadline()
	if b.inFlight < b.maxInFlight && b.readyLocked(b.waiting+1) {
		b.inFlight++
		c.state = leading
		b.mu.Unlock()
		b.lead(ctx, c)
		return c.Res, c.Err
	}
	c.state = waiting
	c.wake = make(chan callState, 1) // only a caller who waits is woken
	b.pending = append(b.pending, c)
	b.waiting++
	b.mu.Unlock()

	// The token says what the state became, so reading it needs no lock.
	ended := ctx.Done()
	if ended == nil {
		if <-c.wake == leading {
			b.lead(ctx, c)
		}
		return c.Res, c.Err
	}
	select {
	case st := <-c.wake:
		if st == leading {
			b.lead(ctx, c)
		}
		return c.Res, c.Err
	case <-ended:
	}
	b.mu.Lock()
	switch c.state {
	case done:
		b.mu.Unlock()
		return c.Res, c.Err
	case taken:
		if b.waitSent {
			b.mu.Unlock()
			<-c.wake // the batch's leader sends done when it ends
			return c.Res, c.Err
		}
	case leading:
		// Promoted just as the caller gave up: pass the lead on so the
		// queue does not stall behind a caller who has left.
		b.inFlight--
		b.promoteLocked()
	case waiting:
		b.waiting--
	}
	c.state = abandoned
	b.mu.Unlock()
	var zero R
	return zero, ctx.Err()
}

// alone runs a batch of req only, for a caller who found a round trip free
// and nobody waiting, so that nobody could join it. The batch serves no one
// else, so it runs on the caller's own context, cancellation and all, and
// costs no more than calling run directly.
func (b *Batcher[Q, R]) alone(ctx context.Context, req Q) (R, error) {
	c := &Call[Q, R]{Req: req, state: taken}
	defer func() {
		b.mu.Lock()
		b.inFlight--
		b.running--
		b.promoteLocked()
		b.mu.Unlock()
	}()
	b.run(ctx, []*Call[Q, R]{c})
	return c.Res, c.Err
}

// lead runs one batch headed by first, then hands the lead on.
func (b *Batcher[Q, R]) lead(ctx context.Context, first *Call[Q, R]) {
	b.mu.Lock()
	batch := make([]*Call[Q, R], 1, min(b.maxBatch, 1+len(b.pending)))
	batch[0] = first
	first.state = taken
	i := 0
	for ; i < len(b.pending) && len(batch) < b.maxBatch; i++ {
		if c := b.pending[i]; c.state == waiting {
			c.state = taken
			b.waiting--
			batch = append(batch, c)
		}
	}
	b.running += len(batch)
	n := copy(b.pending, b.pending[i:])
	clear(b.pending[n:])
	b.pending = b.pending[:n]
	b.mu.Unlock()

	finished := false
	defer func() {
		b.mu.Lock()
		for _, c := range batch {
			if !finished {
				c.Err = ErrBatchPanicked
			}
			if c.state == taken {
				c.state = done
				if c.wake != nil {
					c.wake <- done
				}
			}
		}
		b.inFlight--
		b.running -= len(batch)
		b.promoteLocked()
		b.mu.Unlock()
	}()
	rctx := context.WithoutCancel(ctx)
	if latest, ok := latestDeadline(batch); ok {
		var cancel context.CancelFunc
		rctx, cancel = context.WithDeadline(rctx, latest)
		defer cancel()
	}
	b.run(rctx, batch)
	finished = true
}

// latestDeadline is the latest deadline of the calls, and false if any has
// none.
func latestDeadline[Q, R any](calls []*Call[Q, R]) (time.Time, bool) {
	var latest time.Time
	for _, c := range calls {
		if c.deadline.IsZero() {
			return time.Time{}, false
		}
		if c.deadline.After(latest) {
			latest = c.deadline
		}
	}
	return latest, true
}

// readyLocked tells whether n waiting calls (a caller arriving counted
// among them) may start a batch, as far as EvenBatches is concerned: when
// nothing runs, when they fill a batch, or when they are at least their
// share of all the calls in the Batcher.
func (b *Batcher[Q, R]) readyLocked(n int) bool {
	switch {
	case !b.even || b.inFlight == 0 || n >= b.maxBatch:
		return true
	case n <= 0:
		return false
	}
	return n*b.maxInFlight >= b.running+n
}

// promoteLocked wakes waiting callers to lead while there is room and,
// with EvenBatches, while the calls still waiting make a batch.
func (b *Batcher[Q, R]) promoteLocked() {
	left := b.waiting // those no leader promoted here will take
	for b.inFlight < b.maxInFlight && len(b.pending) > 0 {
		c := b.pending[0]
		if c.state == waiting && !b.readyLocked(left) {
			return
		}
		n := copy(b.pending, b.pending[1:])
		b.pending[n] = nil
		b.pending = b.pending[:n]
		if c.state != waiting {
			continue
		}
		c.state = leading
		b.waiting--
		b.inFlight++
		c.wake <- leading
		left -= b.maxBatch
	}
}

// Invocation is one run of a script in a pipeline.
type Invocation struct {
	Keys []string
	Args []any
}

// RunPipelined runs every invocation of s in one pipeline and returns each
// one's reply or error, in order. Scripts missing from a node's cache
// (NOSCRIPT: a restarted or failed-over node) are loaded and those
// invocations sent again with EVAL, which is safe because a NOSCRIPT reply
// means the script did not run. It works on a ClusterClient too, as long as
// each invocation's keys share one slot.
func RunPipelined(ctx context.Context, rdb redis.UniversalClient, name string, s *redis.Script, invs []Invocation) ([]any, []error) {
	return runPipelined(ctx, rdb, name, s, invs, false)
}

// RunInOrder is RunPipelined for invocations that must run in the order
// given (each takes its place in a FIFO, say). A NOSCRIPT reply would send
// an invocation again after later ones had run, so the first invocation on
// each hash slot goes by EVAL, which also caches the script on that node for
// the EVALSHAs behind it in the same pipeline: one copy of the script's text
// per node and call. Only a SCRIPT FLUSH in the middle of the pipeline can
// still put an invocation out of order (it then runs again by EVAL, after
// the others, as RunPipelined's do).
func RunInOrder(ctx context.Context, rdb redis.UniversalClient, name string, s *redis.Script, invs []Invocation) ([]any, []error) {
	return runPipelined(ctx, rdb, name, s, invs, true)
}

func runPipelined(ctx context.Context, rdb redis.UniversalClient, name string, s *redis.Script, invs []Invocation, ordered bool) ([]any, []error) {
	vals := make([]any, len(invs))
	errs := make([]error, len(invs))
	cmds := make([]*redis.Cmd, len(invs))
	pipe := rdb.Pipeline()
	loaded := map[uint16]bool{}
	for i, inv := range invs {
		if ordered {
			slot := uint16(0)
			if len(inv.Keys) > 0 {
				slot = Slot(inv.Keys[0])
			}
			if !loaded[slot] {
				loaded[slot] = true
				cmds[i] = s.Eval(ctx, pipe, inv.Keys, inv.Args...)
				continue
			}
		}
		cmds[i] = s.EvalSha(ctx, pipe, inv.Keys, inv.Args...)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error

	var retry []int
	for i, cmd := range cmds {
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			retry = append(retry, i)
			continue
		}
		vals[i], errs[i] = cmd.Result()
	}
	if len(retry) > 0 {
		// Loading is for the batches after this one; this one goes by EVAL
		// whether or not the load worked.
		_ = s.Load(ctx, rdb).Err()
		pipe := rdb.Pipeline()
		for _, i := range retry {
			cmds[i] = s.Eval(ctx, pipe, invs[i].Keys, invs[i].Args...)
		}
		_, _ = pipe.Exec(ctx)
		for _, i := range retry {
			vals[i], errs[i] = cmds[i].Result()
		}
	}
	for i, err := range errs {
		if err != nil {
			errs[i] = fmt.Errorf("script %s: %w", name, err)
		}
	}
	return vals, errs
}

// Sharding is how a client spreads keys, which decides what one script call
// may touch.
type Sharding int

const (
	// OneNode: every key is on one server, so one script may take any keys.
	OneNode Sharding = iota
	// BySlot: Redis Cluster; one script's keys must share a hash slot.
	BySlot
	// ByKey: a client-side ring or an unknown client; one key per script.
	ByKey
)

// ShardingOf tells how rdb spreads keys.
func ShardingOf(rdb redis.UniversalClient) Sharding {
	switch rdb.(type) {
	case *redis.Client:
		return OneNode
	case *redis.ClusterClient:
		return BySlot
	}
	return ByKey
}

// Slot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of the key, or
// of its hash tag (the text between the first '{' and the next '}', when
// non-empty), modulo 16384.
func Slot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for bit := 0; bit < 8; bit++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}
