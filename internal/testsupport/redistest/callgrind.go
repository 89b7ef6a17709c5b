package redistest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// CallgrindEnv names a directory: when set, servers run under valgrind's
// callgrind, writing their counts there, and Instructions reads them. A
// server's CPU time on a shared two-core machine moves by tens of percent
// between runs; the instructions it executes for the same commands do
// not, so a change to a script is measured by them (a few per cent of
// background work, Redis's timers, comes with each reading).
//
//	SHAPER_REDIS_CALLGRIND=$(mktemp -d) go test -run TestRedisInstructions -v ./internal/jobstore/
const CallgrindEnv = "SHAPER_REDIS_CALLGRIND"

// ErrNotCounted is Instructions' error for a server not run under callgrind.
var ErrNotCounted = errors.New("redistest: the server is not run under callgrind (set " + CallgrindEnv + ")")

// Instructions is how many instructions the server executed since the
// last call (or since it started): it has callgrind dump its counts and
// reads the total of that dump.
func (s *Server) Instructions() (int64, error) {
	dir := os.Getenv(CallgrindEnv)
	if dir == "" {
		return 0, ErrNotCounted
	}
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		return 0, errors.New("redistest: the server is not running")
	}
	pid := strconv.Itoa(cmd.Process.Pid)
	before, _ := filepath.Glob(filepath.Join(dir, "redis."+pid+".out.*"))
	if out, err := exec.Command("callgrind_control", "--dump", pid).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("callgrind_control --dump %s: %v: %s", pid, err, out)
	}
	// callgrind writes the dump when the server next runs; files are
	// numbered in order, the new one is the one more than before.
	want := filepath.Join(dir, "redis."+pid+".out."+strconv.Itoa(len(before)+1))
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(want); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(l, "totals: "); ok {
					return strconv.ParseInt(strings.Fields(v)[0], 10, 64)
				}
			}
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("redistest: no callgrind dump %s within 30s", want)
		}
	}
}
