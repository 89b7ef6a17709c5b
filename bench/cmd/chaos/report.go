package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/shaperhq/shaper/queue"
)

// maxDupes bounds the duplicates listed one by one.
const maxDupes = 1000

type dupe struct {
	Job   int           `json:"job"`
	OKs   int           `json:"oks"`
	First time.Duration `json:"first_ns"`
	Last  time.Duration `json:"last_ns"`
	// Next is the first kill or Redis crash at or after First; NextWhat
	// says which ("" when none followed).
	Next     time.Duration `json:"next_crash_ns"`
	NextWhat string        `json:"next_crash"`
}

// killSpan is how long before a kill a job's first delivery may be for its
// duplicate to be put down to that kill.
const killSpan = 2 * time.Second

// maxLookups bounds how many lost jobs are looked up one by one.
const maxLookups = 20_000

// result is what one run found. Durations are in nanoseconds in JSON, and
// times ("…At") are since the workers started.
type result struct {
	Jobs        int           `json:"jobs"`
	Rate        int           `json:"rate_per_second"`
	Workers     int           `json:"workers"`
	KillEvery   time.Duration `json:"kill_every_ns"`
	AppendFsync string        `json:"appendfsync"`
	RedisDown   time.Duration `json:"redis_down_ns"`

	// Accepted jobs were answered 202 (or 200 for a key a lost answer had
	// already enqueued); NotAccepted counts the rest by their last answer.
	Accepted    int            `json:"accepted"`
	NotAccepted map[string]int `json:"not_accepted,omitempty"`
	Resent      int64          `json:"items_resent"`
	EnqueuedAt  time.Duration  `json:"enqueued_at_ns"`

	// Delivered counts accepted jobs the upstream answered 2xx at least
	// once; Lost the accepted ones it never did, LostStates what Redis
	// says of them (looked up one by one, up to LostLookedUp of them).
	Delivered         int            `json:"delivered"`
	Lost              int            `json:"lost"`
	LostStates        map[string]int `json:"lost_states,omitempty"`
	LostErrors        map[string]int `json:"lost_last_errors,omitempty"`
	LostLookedUp      int            `json:"lost_looked_up"`
	DeliveredUnknown  int            `json:"delivered_not_accepted"`
	ForeignDeliveries int64          `json:"foreign_deliveries"`
	// Duplicates counts jobs answered 2xx more than once, ExtraDeliveries
	// the 2xx answers beyond the first.
	Duplicates      int `json:"duplicate_jobs"`
	ExtraDeliveries int `json:"extra_deliveries"`
	// DuplicatesAtKill counts duplicate jobs first delivered within
	// killSpan before a kill: answered 2xx to a worker that died before
	// it could record the success.
	DuplicatesAtKill int `json:"duplicates_first_delivered_just_before_a_kill"`
	// DuplicatesAtCrash counts the others first delivered within killSpan
	// before the Redis crash.
	DuplicatesAtCrash int `json:"duplicates_first_delivered_just_before_the_redis_crash"`
	// DuplicateList is every duplicate (up to maxDupes): when it was first
	// and last answered 2xx, and the first kill or crash after its first
	// answer.
	DuplicateList []dupe `json:"duplicates,omitempty"`
	// Final are the queue's counts after the run.
	Final *queue.LaneCounts `json:"final_counts,omitempty"`

	// What the upstream saw: every request, 429s, the most arrivals in any
	// 1s and 100ms window (every arrival counted, refused or not) and the
	// most admitted in any 1s window, the longest gap between arrivals.
	Requests      int64         `json:"upstream_requests"`
	ByStatus      map[int]int64 `json:"upstream_by_status"`
	Rejected      int64         `json:"upstream_429s"`
	WorstWindow   int           `json:"worst_1s_window"`
	WorstTenth    int           `json:"worst_100ms_window"`
	WorstAdmitted int           `json:"worst_1s_window_admitted"`
	LongestGap    time.Duration `json:"longest_gap_ns"`
	// LongestGapDraining is the longest gap while jobs still waited in
	// the queue (the tail of stragglers excluded), and when it began.
	LongestGapDraining   time.Duration `json:"longest_gap_while_draining_ns"`
	LongestGapDrainingAt time.Duration `json:"longest_gap_while_draining_at_ns"`
	// OverLimit lists the stretches in which some 1s window held more
	// arrivals than the limit, each with its worst window.
	OverLimit []overWindow `json:"over_limit_windows,omitempty"`
	// Stalls are the seconds in which a goroutine of this process (which
	// stamps arrivals) waited minStall or more to run.
	Stalls    []stall `json:"stalls,omitempty"`
	DrainRate float64 `json:"drain_rate_per_second"`

	Kills            int             `json:"kills"`
	KillTimes        []time.Duration `json:"kill_times_ns,omitempty"`
	SelfExits        int             `json:"worker_self_exits"`
	LastKillAt       time.Duration   `json:"last_kill_at_ns"`
	RedisCrashAt     time.Duration   `json:"redis_crash_at_ns"`
	RedisBackAt      time.Duration   `json:"redis_back_at_ns"`
	RedisReload      time.Duration   `json:"redis_reload_ns"`
	RedisLose        time.Duration   `json:"redis_lose_ns"`
	AOFDropped       int64           `json:"aof_bytes_dropped"`
	DeliveredAtCrash int64           `json:"delivered_at_crash"`
	ResumeAfterRedis time.Duration   `json:"first_delivery_after_redis_ns"`
	BacklogEmptyAt   time.Duration   `json:"backlog_empty_at_ns"`
	LastDeliveryAt   time.Duration   `json:"last_delivery_at_ns"`
	// Stragglers are jobs first delivered after the queue held no waiting
	// job any more: those a killed worker held until asynq gave them back.
	// Callbacks, with -callbacks, is what became of the jobs' callbacks.
	Callbacks         *callbackResult `json:"callbacks,omitempty"`
	Stragglers        int             `json:"stragglers"`
	StragglerDrain    time.Duration   `json:"last_kill_to_last_delivery_ns"`
	AfterLastKill     int             `json:"delivered_after_last_kill"`
	DeadlinePassed    bool            `json:"deadline_passed"`
	Interrupted       bool            `json:"interrupted"`
	Events            []event         `json:"events"`
	Machine           string          `json:"machine"`
	LoadBefore        string          `json:"load_before"`
	LoadAfter         string          `json:"load_after"`
	Command           string          `json:"command"`
	Date              string          `json:"date"`
	AsynqLease        time.Duration   `json:"asynq_lease_ns"`
	AsynqRecoverEvery time.Duration   `json:"asynq_recoverer_interval_ns"`
}

// overWindow is a stretch of time in which windows of the upstream's
// length held more arrivals than its limit: the worst such window's end
// and count, and how many arrivals ended an over-limit window.
type overWindow struct {
	End      time.Duration `json:"end_ns"`
	Count    int           `json:"count"`
	Arrivals int           `json:"arrivals_over"`
}

// overLimit finds the stretches of sorted times in which a window (t−w, t]
// holds more than limit times; windows that overlap belong to one stretch.
func overLimit(times []time.Duration, w time.Duration, limit int) []overWindow {
	var out []overWindow
	lo := 0
	for hi, t := range times {
		for times[lo] <= t-w {
			lo++
		}
		n := hi - lo + 1
		if n <= limit {
			continue
		}
		if k := len(out) - 1; k >= 0 && t-out[k].End < w {
			out[k].Arrivals++
			if n > out[k].Count {
				out[k].End, out[k].Count = t, n
			}
			continue
		}
		out = append(out, overWindow{End: t, Count: n, Arrivals: 1})
	}
	return out
}

// asynq v0.26's recovery of a dead worker's tasks, from its source
// (internal/rdb.LeaseDuration, recoverer.go, server.go): constants, not
// options.
const (
	asynqLease        = 30 * time.Second // extended every 5s by the heartbeater
	asynqRecoverEvery = time.Minute      // also once at each server's start
	asynqRecoverSlack = 30 * time.Second // a lease must have expired this long ago
)

// judge fills in what the upstream and Redis saw.
func (c *chaos) judge(ctx context.Context, res *result, p *producer) {
	res.AsynqLease, res.AsynqRecoverEvery = asynqLease, asynqRecoverEvery
	res.Accepted = p.acceptedCount()
	res.Resent = p.resent.Load()
	p.mu.Lock()
	if len(p.refused) > 0 {
		res.NotAccepted = maps.Clone(p.refused)
	}
	p.mu.Unlock()

	// The upstream's clock started a little before the run's.
	offset := c.t0.Sub(c.up.t0)
	var lost []string
	var firsts []time.Duration
	for i, id := range p.ids {
		n := int(c.up.oks[i].Load())
		if n > 0 {
			firsts = append(firsts, time.Duration(c.up.firstOK[i].Load())-offset)
		}
		if n > 1 {
			res.Duplicates++
			res.ExtraDeliveries += n - 1
			first := time.Duration(c.up.firstOK[i].Load()) - offset
			if len(res.DuplicateList) < maxDupes {
				d := dupe{Job: i, OKs: n, First: first, Last: time.Duration(c.up.lastOK[i].Load()) - offset}
				for _, k := range res.KillTimes {
					if k >= first {
						d.Next, d.NextWhat = k, "kill"
						break
					}
				}
				if res.RedisCrashAt >= first && (d.NextWhat == "" || res.RedisCrashAt < d.Next) {
					d.Next, d.NextWhat = res.RedisCrashAt, "redis"
				}
				res.DuplicateList = append(res.DuplicateList, d)
			}
			near := func(k time.Duration) bool { return first <= k && k-first <= killSpan }
			switch {
			case slices.ContainsFunc(res.KillTimes, near):
				res.DuplicatesAtKill++
			case res.RedisCrashAt > 0 && near(res.RedisCrashAt):
				res.DuplicatesAtCrash++
			}
		}
		switch {
		case id == "" && n > 0:
			res.DeliveredUnknown++
		case id != "" && n > 0:
			res.Delivered++
		case id != "":
			lost = append(lost, id)
		}
	}
	res.ForeignDeliveries = c.up.foreign.Load()
	res.Lost = len(lost)
	slices.Sort(firsts)
	if len(firsts) > 0 {
		res.LastDeliveryAt = firsts[len(firsts)-1]
		// The rate over the middle 80% of first deliveries, so that the
		// start and the stragglers do not count.
		lo, hi := len(firsts)/10, len(firsts)*9/10
		if hi > lo && firsts[hi] > firsts[lo] {
			res.DrainRate = float64(hi-lo) / (firsts[hi] - firsts[lo]).Seconds()
		}
	}
	for _, t := range firsts {
		if res.BacklogEmptyAt > 0 && t > res.BacklogEmptyAt {
			res.Stragglers++
		}
		if res.Kills > 0 && t > res.LastKillAt {
			res.AfterLastKill++
		}
	}
	if res.Kills > 0 && res.LastDeliveryAt > res.LastKillAt {
		res.StragglerDrain = res.LastDeliveryAt - res.LastKillAt
	}
	if res.RedisBackAt > 0 {
		if i, _ := slices.BinarySearch(firsts, res.RedisBackAt); i < len(firsts) {
			res.ResumeAfterRedis = firsts[i] - res.RedisBackAt
		}
	}

	arrivals := make([]time.Duration, 0, len(firsts))
	for _, rec := range c.up.fake.Records() {
		arrivals = append(arrivals, rec.At-offset)
	}
	slices.Sort(arrivals)
	res.OverLimit = overLimit(arrivals, time.Second, res.Rate)
	for i := 1; i < len(arrivals); i++ {
		if res.BacklogEmptyAt > 0 && arrivals[i] > res.BacklogEmptyAt {
			break
		}
		if g := arrivals[i] - arrivals[i-1]; g > res.LongestGapDraining {
			res.LongestGapDraining, res.LongestGapDrainingAt = g, arrivals[i-1]
		}
	}

	rep := c.up.fake.Report()
	res.Requests, res.ByStatus, res.Rejected = rep.Total, rep.ByStatus, rep.Rejected
	res.WorstWindow, res.WorstTenth, res.WorstAdmitted = rep.MaxInWindow, rep.MaxInTenth, rep.MaxAdmittedInWindow
	res.LongestGap = rep.Gaps.Max
	if rep.Dropped > 0 {
		c.note("the upstream dropped %d old records; its windows cover the last %d arrivals", rep.Dropped, rep.Records)
	}

	if m, err := c.q.Counts(ctx, upstreamName); err == nil {
		lc := m[laneName]
		res.Final = &lc
	}
	if len(lost) > 0 {
		res.LostStates, res.LostErrors = map[string]int{}, map[string]int{}
		for _, id := range lost[:min(len(lost), maxLookups)] {
			if ctx.Err() != nil {
				break
			}
			res.LostLookedUp++
			info, err := c.q.Get(ctx, id, "")
			switch {
			case errors.Is(err, queue.ErrNotFound):
				res.LostStates["not in Redis"]++
			case err != nil:
				res.LostStates["lookup failed"]++
			default:
				res.LostStates[string(info.State)]++
				if info.LastError != "" {
					res.LostErrors[trim(info.LastError, 100)]++
				}
			}
		}
	}
}

func trim(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func writeJSON(w io.Writer, res *result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}

func secs(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) }

func pct(n, of int) string {
	if of == 0 {
		return "–"
	}
	return fmt.Sprintf("%.3f%%", 100*float64(n)/float64(of))
}

func counted(m map[string]int) string {
	if len(m) == 0 {
		return "–"
	}
	keys := slices.Sorted(maps.Keys(m))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

func writeTable(w io.Writer, r *result) {
	fmt.Fprintf(w, "### Chaos run: %d jobs at %d/s, %d workers, kill -9 every %v, one Redis crash (AOF appendfsync %s)\n\n",
		r.Jobs, r.Rate, r.Workers, r.KillEvery, r.AppendFsync)
	switch {
	case r.Interrupted:
		fmt.Fprintf(w, "**Interrupted**: the figures cover the run so far.\n\n")
	case r.DeadlinePassed:
		fmt.Fprintf(w, "**The deadline passed** before every accepted job was delivered and the queue empty.\n\n")
	}
	fmt.Fprintf(w, "| figure | value |\n| --- | --- |\n")
	fmt.Fprintf(w, "| accepted (202 from `POST /v1/jobs/batch`) | %d of %d (items sent again after a failed answer: %d) |\n", r.Accepted, r.Jobs, r.Resent)
	if len(r.NotAccepted) > 0 {
		fmt.Fprintf(w, "| not accepted, by last answer | %s |\n", counted(r.NotAccepted))
	}
	fmt.Fprintf(w, "| delivered (accepted jobs the upstream answered 2xx) | %d |\n", r.Delivered)
	fmt.Fprintf(w, "| **lost** (accepted, never delivered) | **%d** (%s) |\n", r.Lost, pct(r.Lost, r.Accepted))
	if r.Lost > 0 {
		fmt.Fprintf(w, "| lost jobs' state in Redis (%d looked up) | %s |\n", r.LostLookedUp, counted(r.LostStates))
		if len(r.LostErrors) > 0 {
			fmt.Fprintf(w, "| lost jobs' last error | %s |\n", counted(r.LostErrors))
		}
	}
	if r.DeliveredUnknown > 0 || r.ForeignDeliveries > 0 {
		fmt.Fprintf(w, "| delivered but never answered 202 / with an unknown key | %d / %d |\n", r.DeliveredUnknown, r.ForeignDeliveries)
	}
	fmt.Fprintf(w, "| **duplicate deliveries** (jobs answered 2xx more than once) | **%d** jobs, %d extra 2xx (%s of accepted); first delivered less than %v before a worker kill: %d, before the Redis crash: %d |\n",
		r.Duplicates, r.ExtraDeliveries, pct(r.Duplicates, r.Accepted), killSpan, r.DuplicatesAtKill, r.DuplicatesAtCrash)
	if len(r.DuplicateList) > 0 {
		var toNext, apart []time.Duration
		for _, d := range r.DuplicateList {
			if d.NextWhat != "" {
				toNext = append(toNext, d.Next-d.First)
			}
			apart = append(apart, d.Last-d.First)
		}
		slices.Sort(toNext)
		slices.Sort(apart)
		fmt.Fprintf(w, "| duplicates: first 2xx to the next kill or crash | %s |\n", spread(toNext))
		fmt.Fprintf(w, "| duplicates: first 2xx to the last | %s |\n", spread(apart))
	}
	if f := r.Final; f != nil {
		fmt.Fprintf(w, "| queue at the end | succeeded %d, dead %d, pending %d, active %d, retry %d, scheduled %d |\n",
			f.Succeeded, f.Dead, f.Pending, f.Active, f.Retry, f.Scheduled)
	}
	writeCallbacks(w, r.Callbacks)
	fmt.Fprintf(w, "| requests at the upstream | %d (by status: %s) |\n", r.Requests, byStatus(r.ByStatus))
	over := ""
	if r.WorstWindow > r.Rate {
		over = " **over the limit**"
	}
	fmt.Fprintf(w, "| worst 1s window at the upstream (every arrival) | %d of %d%s; admitted %d; worst 100ms %d |\n",
		r.WorstWindow, r.Rate, over, r.WorstAdmitted, r.WorstTenth)
	fmt.Fprintf(w, "| drain rate (middle 80%% of first deliveries) | %.1f/s (%.1f%% of the limit) |\n", r.DrainRate, 100*r.DrainRate/float64(r.Rate))
	if len(r.OverLimit) > 0 {
		parts := make([]string, len(r.OverLimit))
		for i, o := range r.OverLimit {
			parts[i] = fmt.Sprintf("%d in the 1s up to %s (%d arrivals ended an over-limit window; nearest event: %s; worst stall of the stamping process within 2s: %v)",
				o.Count, secs(o.End), o.Arrivals, nearest(r.Events, o.End), worstNear(r.Stalls, o.End, 2*time.Second).Round(100*time.Microsecond))
		}
		fmt.Fprintf(w, "| windows over the limit | %s |\n", strings.Join(parts, "; "))
	}
	fmt.Fprintf(w, "| longest gap between arrivals | %v while jobs waited (from %s; nearest event: %s); %v counting the stragglers' wait |\n",
		r.LongestGapDraining.Round(time.Millisecond), secs(r.LongestGapDrainingAt), nearest(r.Events, r.LongestGapDrainingAt), r.LongestGap.Round(time.Millisecond))
	var worst time.Duration
	for _, s := range r.Stalls {
		worst = max(worst, s.Worst)
	}
	fmt.Fprintf(w, "| stalls of the process stamping arrivals | %d seconds with a goroutine waiting ≥ %v to run; the worst ≥ %v |\n", len(r.Stalls), minStall, worst.Round(100*time.Microsecond))
	fmt.Fprintf(w, "| worker kills (kill -9, restarted at once) | %d, the last at %s; workers that exited by themselves: %d |\n", r.Kills, secs(r.LastKillAt), r.SelfExits)
	if r.RedisCrashAt > 0 {
		fmt.Fprintf(w, "| Redis crash (kill -9) | at %s with %d delivered; down %v; AOF reloaded in %v; first new delivery %v after it was back |\n",
			secs(r.RedisCrashAt), r.DeliveredAtCrash, r.RedisDown, r.RedisReload.Round(time.Millisecond), r.ResumeAfterRedis.Round(time.Millisecond))
		if r.RedisLose > 0 {
			fmt.Fprintf(w, "| AOF cut back by %v (emulated power loss) | %d bytes dropped |\n", r.RedisLose, r.AOFDropped)
		}
	}
	fmt.Fprintf(w, "| enqueue done / no job waiting / last delivery | %s / %s / %s |\n", secs(r.EnqueuedAt), secs(r.BacklogEmptyAt), secs(r.LastDeliveryAt))
	fmt.Fprintf(w, "| stragglers (first delivered after no job was waiting) | %d; last kill → last delivery %s; %d jobs delivered after the last kill |\n",
		r.Stragglers, secs(r.StragglerDrain), r.AfterLastKill)
	fmt.Fprintf(w, "\nasynq v0.26 gives a killed worker's tasks back through its recoverer: a task's lease lasts %v and is extended every 5s while its "+
		"worker lives; every %v (and once when any server starts) each server's recoverer takes back tasks whose lease expired at least %v earlier. "+
		"So a killed worker's jobs return between about 55s and 2 minutes after the kill.\n",
		asynqLease, asynqRecoverEvery, asynqRecoverSlack)
	fmt.Fprintf(w, "\n| at | event |\n| ---: | --- |\n")
	for _, e := range r.Events {
		fmt.Fprintf(w, "| %s | %s |\n", secs(e.At), strings.ReplaceAll(e.What, "|", "\\|"))
	}
	fmt.Fprintf(w, "\nMachine: %s. Load average before: %s; after: %s. %s.\n", r.Machine, r.LoadBefore, r.LoadAfter, r.Date)
	fmt.Fprintf(w, "Command: `%s`\n", r.Command)
}

// spread summarises sorted durations: min, median, max.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "–"
	}
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf("min %v, median %v, max %v (%d)", r(ds[0]), r(ds[len(ds)/2]), r(ds[len(ds)-1]), len(ds))
}

// nearest names the event closest in time to at.
func nearest(events []event, at time.Duration) string {
	best := -1
	for i, e := range events {
		if best < 0 || (e.At-at).Abs() < (events[best].At-at).Abs() {
			best = i
		}
	}
	if best < 0 {
		return "none"
	}
	e := events[best]
	what, _, _ := strings.Cut(e.What, ";")
	return fmt.Sprintf("%s at %s", what, secs(e.At))
}

func byStatus(m map[int]int64) string {
	if len(m) == 0 {
		return "–"
	}
	codes := slices.Sorted(maps.Keys(m))
	parts := make([]string, len(codes))
	for i, c := range codes {
		parts[i] = fmt.Sprintf("%d× %d", m[c], c)
	}
	return strings.Join(parts, ", ")
}
