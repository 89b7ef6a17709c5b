package dispatcher

import (
	"net/http"
	"strconv"
	"time"

	"github.com/shaperhq/shaper/internal/pushback"
	"github.com/shaperhq/shaper/internal/ratelimit"
	"github.com/shaperhq/shaper/queue"
)

// kind is what to do with a job after an attempt.
type kind int

const (
	kindDone     kind = iota // finished: keep the response
	kindRetry                // failed, may succeed later: back off, spend an attempt
	kindDead                 // failed for good
	kindPushback             // the upstream is saturated: wait, spend no attempt
)

func (k kind) String() string {
	switch k {
	case kindDone:
		return "done"
	case kindRetry:
		return "retry"
	case kindDead:
		return "dead"
	case kindPushback:
		return "pushback"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// verdict is the reading of one upstream answer.
type verdict struct {
	kind kind
	// block, when positive, pauses the whole upstream for every replica,
	// with one of queue's Block reasons.
	block       time.Duration
	blockReason string
	// until is when the fleet-wide block this answer placed (or found in
	// force) ends, once heed has placed it; zero when it placed none.
	until time.Time
	// bare is a 429 that said nothing about when to come back: the
	// upstream is paused by a pushback that grows while they repeat
	// (leaky.Bucket.Pushback), and the job waits as long.
	bare bool
	// refused is a 429 that concerns the whole upstream: adaptive limits
	// are cut.
	refused bool
	// wait is the least delay before this job's next attempt.
	wait   time.Duration
	reason string
	// rd is the answer's rate-limit headers, for what the upstream states.
	rd *ratelimit.Reading
	// sentAt is the send's slot on Redis's clock: a bare 429 to a send
	// made before the last pause began says nothing about that pause.
	sentAt time.Time
}

// classify reads an upstream's HTTP answer, given how far apart this
// replica's bucket spaces sends (spacing).
//
// A success whose quota headers say nothing is left is normal at the
// limit: the next unit frees as soon as the reset implies (reset/limit
// for a quota that names its limit), so the upstream is held only if that
// is longer than shaper's own spacing would hold it anyway. Only an actual
// 429 blocks the upstream until its Retry-After or reset; a 429 with no
// time at all is a bare pushback (see verdict.bare). Stripe's
// endpoint-scoped reasons delay only the job.
func classify(status int, h http.Header, rd ratelimit.Reading, spacing time.Duration) verdict {
	switch {
	case status >= 200 && status < 300:
		v := verdict{kind: kindDone}
		if next := rd.NextUnit(); next > spacing {
			v.block, v.blockReason = next, queue.BlockQuota
		}
		return v
	case status == http.StatusTooManyRequests:
		r := pushback.Read(h, rd)
		v := verdict{kind: kindPushback, wait: r.Wait, reason: r.Reason, refused: r.Whole, bare: r.Bare}
		if r.Whole && !r.Bare {
			v.block, v.blockReason = r.Wait, queue.BlockRefused
		}
		return v
	case status == http.StatusRequestTimeout, status == http.StatusTooEarly, status >= 500:
		return verdict{kind: kindRetry, wait: rd.RetryAfter, reason: "upstream answered " + strconv.Itoa(status)}
	case status >= 300 && status < 400:
		return verdict{kind: kindDead, reason: "upstream answered " + strconv.Itoa(status) + " (redirects are not followed)"}
	default:
		return verdict{kind: kindDead, reason: "upstream answered " + strconv.Itoa(status)}
	}
}

// responseClass is the metric label for an answer.
func responseClass(status int) string {
	switch {
	case status == http.StatusTooManyRequests:
		return "429"
	case status >= 500:
		return "5xx"
	case status >= 400:
		return "4xx"
	case status >= 300:
		return "3xx"
	default:
		return "2xx"
	}
}
