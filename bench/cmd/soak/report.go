package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/shaperhq/shaper/fakeupstream"
)

// result is what one soak saw.
type result struct {
	o        options
	samples  []sample
	elapsed  time.Duration // the producer's run
	refusals string
	report   fakeupstream.Report // the upstream's, after every process stopped
	cpu      string              // CPU used by each kind of process, as shares of one core
	// rejections are the 429s found in the upstream's records.
	rejections []refusal
}

// write prints the samples and the summary, and reports whether the run
// failed: any 429, any enqueue refused, or a drain or a producer that fell
// behind.
func (r result) write(out io.Writer) (failed bool) {
	o := r.o
	fmt.Fprintf(out, "| t | used_memory MB | Redis RSS MB | keys | serve RSS MB | worker RSS MB (%d) | harness RSS MB | enqueued | admitted | 429s | backlog | refused | producer lag |\n", o.workers)
	fmt.Fprintf(out, "| ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, s := range r.samples {
		bl := fmt.Sprint(s.Backlog)
		if s.BacklogNote != "" {
			bl = "?"
		}
		fmt.Fprintf(out, "| %v | %s | %s | %d | %s | %s | %s | %d | %d | %d | %s | %d | %d |\n",
			s.At.Round(time.Second), mb(s.UsedMemory), mb(s.RedisRSS), s.Keys, mb(s.ServeRSS), joinMB(s.WorkerRSS), mb(s.SelfRSS),
			s.Enqueued, s.Admitted, s.Rejected, bl, s.Refused, s.Lag)
	}
	fmt.Fprintln(out)
	if len(r.samples) == 0 {
		fmt.Fprintf(out, "No samples: the run ended before the first one (-sample %v).\n", o.sample)
		return true
	}
	first, last := r.samples[0], r.samples[len(r.samples)-1]

	ref := plateauFrom(o.duration)
	refSample, _ := at(r.samples, ref)
	half := o.duration / 2
	halfSample, _ := at(r.samples, half)
	g, _ := growth(r.samples, half)
	serveMax, workerMax, redisMax, selfMax := maxRSS(r.samples)
	rate := float64(last.Admitted) / last.At.Seconds()
	steady := 0.0
	if span := (last.At - first.At).Seconds(); span > 0 {
		steady = float64(last.Admitted-first.Admitted) / span
	}
	fmt.Fprintf(out, "Summary: used_memory %s MB at %v, %s MB at the end (%v); over the last half (from %v, %s MB) it grew %+.1f%%. "+
		"Max RSS: serve %s MB, worker %s MB, Redis %s MB, harness %s MB. 429s: %d. "+
		"Achieved %.1f admitted/s over %v (%.1f/s from the first sample to the last; %d/s enqueued). Backlog at the end: %s. Enqueues refused: %d. CPU, of one core: %s.\n",
		mb(refSample.UsedMemory), refSample.At.Round(time.Second), mb(last.UsedMemory), last.At.Round(time.Second),
		halfSample.At.Round(time.Second), mb(halfSample.UsedMemory), g,
		mb(serveMax), mb(workerMax), mb(redisMax), mb(selfMax), r.report.Rejected,
		rate, last.At.Round(time.Second), steady, o.rate, backlogText(last), last.Refused, r.cpu)

	if len(r.rejections) > 0 {
		fmt.Fprintf(out, "429s: %s.\n", describeRefusals(r.rejections, o.limit))
	}
	if n := int64(len(r.rejections)); n < r.report.Rejected {
		fmt.Fprintf(out, "%d 429s were no longer in the upstream's records when looked for.\n", r.report.Rejected-n)
	}

	var why []string
	if r.report.Rejected > 0 {
		why = append(why, fmt.Sprintf("the upstream answered %d 429s (%v)", r.report.Rejected, r.report.RejectedBy))
	}
	if last.BacklogNote != "" {
		why = append(why, "the backlog at the end could not be read: "+last.BacklogNote)
	} else if last.Backlog > o.maxBacklog {
		why = append(why, fmt.Sprintf("the drain fell behind: backlog %d at the end, over %d (-max-backlog)", last.Backlog, o.maxBacklog))
	}
	if last.Refused > 0 {
		why = append(why, "enqueues were refused: "+r.refusals)
	}
	if last.Lag > int64(o.rate) {
		why = append(why, fmt.Sprintf("the producer fell %d jobs (over a second) behind its schedule: this machine cannot send %d/s", last.Lag, o.rate))
	}
	if len(why) == 0 {
		fmt.Fprintf(out, "Verdict: PASS (no 429, backlog at the end %d ≤ %d, no enqueue refused, producer on schedule).\n", last.Backlog, o.maxBacklog)
		return false
	}
	fmt.Fprintf(out, "Verdict: FAIL: %s.\n", strings.Join(why, "; "))
	return true
}

func backlogText(s sample) string {
	if s.BacklogNote != "" {
		return "unknown (" + s.BacklogNote + ")"
	}
	return fmt.Sprint(s.Backlog)
}
