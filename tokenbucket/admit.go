package tokenbucket

import (
	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/script"
)

// AdmitLua is the Lua library through which a script of another package
// decides a key's admission in the same call as its own work, so that the
// two are one round trip: the job store pays a proxied call's admission
// and books its send slot at once, and books nothing for a call admission
// refuses. lua.go states what it defines. The script names each bucket's
// Admission.Key among its KEYS, which a Redis Cluster puts in a slot of the
// bucket's own: only a script on a single server can take it beside
// another store's keys.
func AdmitLua() string { return admitLua }

// Admission is one decision of a Limiter's that a script makes through
// AdmitLua: the bucket to read and write, and what to pass tb_admit.
type Admission struct {
	// Key is the bucket's Redis key.
	Key string
	// Interval (µs a token takes to come back) and Capacity are the
	// bucket's shape, Cost the tokens asked.
	Interval, Capacity, Cost int64

	limiter *Limiter
}

// Admission is the decision Allow(ctx, key, n) would make, for a script to
// make through AdmitLua; it refuses what Allow refuses as invalid.
func (l *Limiter) Admission(key string, n int64) (Admission, error) {
	if err := checkArgs(l.limit, key, n); err != nil {
		return Admission{}, err
	}
	return Admission{Key: l.key(key), Interval: l.params.Interval, Capacity: l.params.Capacity, Cost: n, limiter: l}, nil
}

// Clock is the now the script decides on, read when it is sent: "" for
// Redis TIME, else the limiter's Config.Now in µs.
func (a Admission) Clock() string { return script.NowArg(a.limiter.now) }

// Limiter is the limiter the admission is of.
func (a Admission) Limiter() *Limiter { return a.limiter }

// Result is the decision as Allow returns it, from the level tb_admit
// answered.
func (a Admission) Result(level int64) shaper.Result { return a.limiter.decode(level, a.Cost) }
