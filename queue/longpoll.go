package queue

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/shaperhq/shaper/internal/jobstore"
)

// MaxWait is the longest one Wait may wait: the API's bound on a long poll
// (GET /v1/jobs/{id}?wait=) and on Prefer: wait.
const MaxWait = 60 * time.Second

// Final reports whether a job in state s is done for good: succeeded, dead
// or cancelled. (A dead or cancelled job may still be retried by hand,
// which makes a new attempt, not a change of this one's outcome.)
func (s State) Final() bool {
	switch s {
	case StateSucceeded, StateDead, StateCancelled:
		return true
	}
	return false
}

// Wait reads job id as Get does, but when it is not final yet, waits up to
// d for it to become final and answers it then, within milliseconds of it
// finishing; when d passes first, it answers the job as it is by then.
// Waiting costs Redis nothing: the scripts that make a job final announce
// it (jobstore.Finals), and the job is read again only when it is
// announced, at the end of d, or when the announcements may have been
// missed (Redis reconnected). An error from Get ends the wait at once (a
// job that is not there is not waited for), as do ctx ending (its error is
// returned) and EndWaits (the job as it is is returned).
func (q *Queue) Wait(ctx context.Context, id, tenant string, d time.Duration) (*Info, error) {
	infos, errs := q.WaitAll(ctx, []string{id}, tenant, d)
	return infos[0], errs[0]
}

// waitReaders bounds the reads of one WaitAll that run at once.
const waitReaders = 16

// WaitAll is Wait for several jobs, in one wait of d: it returns, one
// answer per id, when every job is final or has an error, or when d
// passes, ctx ends or EndWaits is called. A job's answer is its last read,
// or ctx's error when ctx ended while it was not final.
func (q *Queue) WaitAll(ctx context.Context, ids []string, tenant string, d time.Duration) ([]*Info, []error) {
	infos, errs := make([]*Info, len(ids)), make([]error, len(ids))
	// Registered before the first read: a job that became final between
	// that read and the registration would wake no one.
	var w *jobstore.Watch
	if d > 0 {
		w = q.finals.Watch(ids...)
		defer w.Stop()
	}
	at := map[string][]int{}
	for i, id := range ids {
		at[id] = append(at[id], i)
	}
	read := func(which []int) {
		var wg sync.WaitGroup
		sem := make(chan struct{}, waitReaders)
		for _, i := range which {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				infos[i], errs[i] = q.Get(ctx, ids[i], tenant)
				<-sem
			}()
		}
		wg.Wait()
	}
	open := func() []int {
		var out []int
		for i := range ids {
			if errs[i] == nil && (infos[i] == nil || !infos[i].State.Final()) {
				out = append(out, i)
			}
		}
		return out
	}
	all := make([]int, len(ids))
	for i := range all {
		all[i] = i
	}
	read(all)
	if d <= 0 {
		return infos, errs
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		waiting := open()
		if len(waiting) == 0 {
			return infos, errs
		}
		select {
		case <-w.C():
			woken, again := w.Woken()
			if again {
				read(waiting)
				continue
			}
			var which []int
			for _, id := range woken {
				for _, i := range at[id] {
					if errs[i] == nil && (infos[i] == nil || !infos[i].State.Final()) && !slices.Contains(which, i) {
						which = append(which, i)
					}
				}
			}
			read(which)
		case <-timer.C:
			read(waiting)
			return infos, errs
		case <-q.finals.Closed():
			read(waiting)
			return infos, errs
		case <-ctx.Done():
			for _, i := range waiting {
				errs[i] = ctx.Err()
			}
			return infos, errs
		}
	}
}

// EndWaits ends every Wait under way, and every later one at once, each
// answering its job as it is: for a server that shuts down, so that no
// long poll holds its shutdown. Close calls it.
func (q *Queue) EndWaits() { q.finals.Close() }

// Waiters is how many Waits are under way in this process.
func (q *Queue) Waiters() int { return q.finals.Waiters() }
