package jobstore

import (
	"context"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/keyspace"
)

// FinalChannel is where the scripts that make a job final (Finish with
// AnnounceFinal, Recover with it, Cancel) announce it: a message is the ids
// of one call's final jobs, one per line. There is one channel per key
// prefix, not per upstream: on Redis Cluster a PUBLISH reaches every node
// anyway, and a process that waits on jobs of every upstream needs one
// subscription.
func FinalChannel(prefix string) string { return keyspace.Prefix(prefix) + ":final" }

// AnnounceFinal makes a Finish (or Recover) publish the ids of the tasks it
// makes final, succeeded or dead, on channel (FinalChannel): one PUBLISH per
// call however many wait, so a long poll costs Redis nothing while it waits.
func AnnounceFinal(channel string) FinishOption {
	return func(o *finishOpts) { o.final = channel }
}

// finalIDs reads a FinalChannel message.
func finalIDs(payload string) []string { return strings.Split(payload, "\n") }

// Finals tells waiters when the jobs they wait for become final, from one
// subscription to FinalChannel per process, whoever waits and however many.
// A Watch is woken when its job is announced, and every Watch is woken
// whenever the subscription is made (again): messages published while it
// was down are lost, so a woken waiter reads its job again rather than
// trust it is final. The subscription starts with the first Watch, so a
// process that never waits never subscribes; Close ends it. Build it with
// NewFinals.
type Finals struct {
	rdb     redis.UniversalClient
	channel string

	mu      sync.Mutex
	by      map[string][]*Watch
	waiters int
	started bool
	closed  chan struct{} // closed by Close
	done    chan struct{} // closed when the subscriber has stopped
}

// NewFinals builds the waiters' hub of the jobs under a key prefix ("" =
// default) on rdb, which the caller owns and closes after Close.
func NewFinals(rdb redis.UniversalClient, prefix string) *Finals {
	return &Finals{rdb: rdb, channel: FinalChannel(prefix), by: map[string][]*Watch{},
		closed: make(chan struct{}), done: make(chan struct{})}
}

// Watch is one waiter's registration for some jobs. Read C, then Woken to
// learn which jobs to read again.
type Watch struct {
	f   *Finals
	ids []string
	c   chan struct{}

	stopped bool // under f.mu

	mu    sync.Mutex
	woken []string
	all   bool
}

// Watch registers a waiter for ids. Register before reading the jobs: a
// job made final between the read and the registration would otherwise
// wake no one. Stop it when done.
func (f *Finals) Watch(ids ...string) *Watch {
	w := &Watch{f: f, ids: ids, c: make(chan struct{}, 1)}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		f.by[id] = append(f.by[id], w)
	}
	f.waiters++
	if !f.started {
		f.started = true
		select {
		case <-f.closed:
			close(f.done)
		default:
			go f.subscribe()
		}
	}
	return w
}

// C receives when a watched job may have become final: read Woken.
func (w *Watch) C() <-chan struct{} { return w.c }

// Woken returns the jobs announced since the last call, or all true when
// every watched job must be read again (the subscription was made anew).
func (w *Watch) Woken() (ids []string, all bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids, all = w.woken, w.all
	w.woken, w.all = nil, false
	return ids, all
}

func (w *Watch) wake(id string) {
	w.mu.Lock()
	if id == "" {
		w.all = true
	} else {
		w.woken = append(w.woken, id)
	}
	w.mu.Unlock()
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// Stop removes the registration; calling it again does nothing.
func (w *Watch) Stop() {
	f := w.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if w.stopped {
		return
	}
	w.stopped = true
	f.waiters--
	for _, id := range w.ids {
		list := f.by[id]
		for i, o := range list {
			if o == w {
				list = append(list[:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(f.by, id)
		} else {
			f.by[id] = list
		}
	}
}

// Closed is closed by Close: waiters stop waiting and answer what they
// have.
func (f *Finals) Closed() <-chan struct{} { return f.closed }

// Waiters is how many watches are registered.
func (f *Finals) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.waiters
}

// Close ends the subscription and closes Closed, and waits for the
// subscriber to stop. It may be called more than once.
func (f *Finals) Close() {
	f.mu.Lock()
	select {
	case <-f.closed:
	default:
		close(f.closed)
	}
	started := f.started
	f.mu.Unlock()
	if started {
		<-f.done
	}
}

// subscribe runs the subscription until Close. go-redis's channel pings an
// idle connection and subscribes again after a failure; each subscription
// it makes (the first included: a watch may predate it) wakes every watch.
func (f *Finals) subscribe() {
	defer close(f.done)
	ps := f.rdb.Subscribe(context.Background(), f.channel)
	defer ps.Close()
	ch := ps.ChannelWithSubscriptions(redis.WithChannelSize(1024))
	for {
		select {
		case <-f.closed:
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			switch m := m.(type) {
			case *redis.Subscription:
				if m.Kind == "subscribe" {
					f.wakeAll()
				}
			case *redis.Message:
				f.wake(finalIDs(m.Payload))
			}
		}
	}
}

func (f *Finals) wake(ids []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		for _, w := range f.by[id] {
			w.wake(id)
		}
	}
}

func (f *Finals) wakeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, list := range f.by {
		for _, w := range list {
			w.wake("")
		}
	}
}
