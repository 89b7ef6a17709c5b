package server

import (
	"context"
	"time"

	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/script"
)

// A call is shown as waiting fleet-wide (the upstream's waiting set, which
// `shaper status` and GET /v1/upstreams/{name} count) once it is known to
// wait for its slot, not before: a call that has room books its slot and
// goes, one round trip to Redis for the booking rather than three (mark,
// book, unmark). The mark is written beside the wait, not before it, so
// it never delays the send; the calls of one replica that begin to wait
// (or finish) together share a round trip.

// markWaitingAfter is the shortest wait that shows a call as waiting: a
// call whose slot comes sooner is under way, not waiting.
const markWaitingAfter = 5 * time.Millisecond

// markTimeout bounds writing or removing a mark; a mark is for the eyes
// only, so a call never fails for want of one.
const markTimeout = 2 * time.Second

// waitMarks writes and removes the waiting marks of one upstream's calls,
// batched.
type waitMarks struct {
	marks   *script.Batcher[jobstore.Waiter, struct{}]
	unmarks *script.Batcher[string, struct{}]
}

func (s *Server) newWaitMarks(e *proxyEntry) *waitMarks {
	return &waitMarks{
		marks: script.NewBatcher(script.BatchOptions{}, func(ctx context.Context, calls []*script.Call[jobstore.Waiter, struct{}]) {
			ws := make([]jobstore.Waiter, len(calls))
			for i, c := range calls {
				ws[i] = c.Req
			}
			err := e.space.WaitingAll(ctx, s.rdb, ws, e.up.Proxy.MaxWait)
			for _, c := range calls {
				c.Err = err
			}
		}),
		unmarks: script.NewBatcher(script.BatchOptions{}, func(ctx context.Context, calls []*script.Call[string, struct{}]) {
			ids := make([]string, len(calls))
			for i, c := range calls {
				ids[i] = c.Req
			}
			err := e.space.DoneWaiting(ctx, s.rdb, ids...)
			for _, c := range calls {
				c.Err = err
			}
		}),
	}
}

// waitMark is one call's mark: none until the call waits.
type waitMark struct {
	s        *Server
	e        *proxyEntry
	deadline time.Time // the end of the call's wait
	id       string
	written  chan bool // the mark's write, once started: whether it took
}

// waits shows the call as waiting if it is about to wait for d or longer
// and is not shown yet. It returns at once: the mark is written while the
// call waits.
func (m *waitMark) waits(ctx context.Context, d time.Duration) {
	if m.written != nil || d < markWaitingAfter {
		return
	}
	m.id = newWaiterID()
	m.written = make(chan bool, 1)
	w := jobstore.Waiter{ID: m.id, Wait: max(time.Until(m.deadline), d)}
	bg := context.WithoutCancel(ctx)
	go func() {
		ctx, cancel := context.WithTimeout(bg, markTimeout)
		defer cancel()
		_, err := m.e.marks.marks.Do(ctx, w)
		if err != nil {
			m.s.m.RedisErrors.WithLabelValues("pacing").Inc()
		}
		m.written <- err == nil
	}()
}

// done removes the call's mark, if it has one, once it is written.
func (m *waitMark) done(ctx context.Context) {
	if m.written == nil || !<-m.written {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
	defer cancel()
	if _, err := m.e.marks.unmarks.Do(ctx, m.id); err != nil {
		m.s.m.RedisErrors.WithLabelValues("pacing").Inc()
	}
}
