// Package childproc runs the current test binary again as child processes,
// for tests whose claims are about several OS processes sharing Redis: each
// child has its own connections, scheduler and timers, as replicas would.
//
// A test package routes children in TestMain:
//
//	func TestMain(m *testing.M) {
//		if childproc.Role() != "" {
//			os.Exit(runChild(childproc.Role()))
//		}
//		...
//	}
package childproc

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

const envRole = "SHAPER_CHILD_ROLE"

// Role is the role this process was started with, or "" in the parent.
func Role() string { return os.Getenv(envRole) }

// Command prepares a child running this test binary in role, with extra
// environment entries ("KEY=value"). Its stderr goes to the test log.
func Command(tb testing.TB, role string, env ...string) *exec.Cmd {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), envRole+"="+role), env...)
	cmd.Stderr = &logWriter{tb: tb, prefix: role}
	return cmd
}

// Lines reads a child's stdout line by line until EOF.
func Lines(r io.Reader) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out, sc.Err()
}

type logWriter struct {
	tb     testing.TB
	prefix string
}

func (w *logWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w.tb.Logf("[%s] %s", w.prefix, line)
	}
	return len(p), nil
}
