package dispatcher

import (
	"fmt"
	"strconv"
	"time"

	"github.com/shaperhq/shaper/queue"
)

// outcomeKind is how a worker ends its turn with a job.
type outcomeKind uint8

const (
	// outSucceeded: done; its response is kept for the result retention.
	outSucceeded outcomeKind = iota + 1
	// outRetry: the attempt failed and is spent; it runs again after delay.
	outRetry
	// outHandBack: it waits delay for its upstream (waitsFor) and runs
	// again, spending no attempt.
	outHandBack
	// outDead: it failed for good.
	outDead
	// outRequeue: it was not sent (the shutdown, a missed slot, a block)
	// and goes back to the head of its queue as it was.
	outRequeue
)

func (k outcomeKind) String() string {
	switch k {
	case outSucceeded:
		return "succeeded"
	case outRetry:
		return "retry"
	case outHandBack:
		return "hand back"
	case outDead:
		return "dead"
	case outRequeue:
		return "requeue"
	}
	return "outcomeKind(" + strconv.Itoa(int(k)) + ")"
}

// outcome is what a worker decided about a job (run) and records (end):
// one value, never an error to be told apart by its type or its words.
type outcome struct {
	kind outcomeKind
	// resp is the upstream's answer to store, as the upstream's
	// store_response keeps it; nil stores none.
	resp *queue.Response
	// delay (outRetry, outHandBack) is how long the job waits before a
	// worker takes it again.
	delay time.Duration
	// waitsFor (outHandBack) is what it waits for: queue.WaitingPushback,
	// or "" for a wait of shaper's own (its store unreachable).
	waitsFor string
	// why (outRetry, outHandBack, outDead) says what happened in words.
	why string
}

func succeeded(resp *queue.Response) outcome { return outcome{kind: outSucceeded, resp: resp} }

func retryAfter(delay time.Duration, why string) outcome {
	return outcome{kind: outRetry, delay: delay, why: why}
}

// handBack returns the job to its queue after delay, spending no attempt,
// for a wait of shaper's own.
func handBack(delay time.Duration, why string) outcome {
	return outcome{kind: outHandBack, delay: delay, why: why}
}

// pushedBack hands back the job an upstream refused (a 429): it waits,
// spending no attempt, and says what for and when that ends (on Redis's
// clock, as the block is kept), and the answer.
func pushedBack(v verdict, now time.Time) outcome {
	why := "job held until " + stamp(now.Add(v.wait)) + " (" + v.reason + ")"
	if !v.until.IsZero() {
		why = "upstream blocked until " + stamp(v.until) + " (" + v.reason + ")"
	}
	return outcome{kind: outHandBack, delay: v.wait, waitsFor: queue.WaitingPushback, why: why}
}

func dead(format string, args ...any) outcome {
	return outcome{kind: outDead, why: fmt.Sprintf(format, args...)}
}

// requeue: not sent; back to the head of its queue.
func requeue() outcome { return outcome{kind: outRequeue} }

// with is o keeping resp as the job's stored answer.
func (o outcome) with(resp *queue.Response) outcome {
	o.resp = resp
	return o
}

// lastError is what asynq keeps as the job's last error, for asynq's own
// tools to show: a hand-back reads "waiting for pushback: upstream blocked
// until 2026-11-30T14:02:07.250Z (429 from upstream)", or "waiting: ..."
// for a wait that names nothing. Only a person reads it: shaper tells a
// hand-back by its mark (jobstore.Finished.WaitsFor).
func (o outcome) lastError() string {
	switch {
	case o.kind != outHandBack:
		return o.why
	case o.waitsFor == "":
		return "waiting: " + o.why
	}
	return "waiting for " + o.waitsFor + ": " + o.why
}

// stamp writes a time as a reader of asynq's tools wants it: UTC, to the
// millisecond.
func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }
