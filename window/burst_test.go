package window

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/testsupport/childproc"
)

const burstRole = "window-burst"

// burstJob is one burst of TestBurstAcrossProcesses.
type burstJob struct {
	kind          string
	rate, callers int64 // callers in all processes together
}

func (j burstJob) String() string { return fmt.Sprintf("%s:%d:%d", j.kind, j.rate, j.callers) }

// Admission is exact however many processes ask at once: callers spread
// over 4 OS processes, each with 2 clients of its own, all released
// together against one key, get exactly Rate allowed. The sliding limiters
// run on Redis's clock; the fixed window gets a frozen clock, since Redis's
// could cross a window boundary mid-burst and rightly admit a second Rate.
// The same 4 processes run every burst in turn, as starting a race-enabled
// binary is the slow part.
func TestBurstAcrossProcesses(t *testing.T) {
	noLeaks(t)
	const processes = 4
	var jobs []burstJob
	for _, a := range algorithms() {
		jobs = append(jobs, burstJob{a.kind, 10, 20}, burstJob{a.kind, 100, 1000})
	}
	spec := make([]string, len(jobs))
	for i, j := range jobs {
		spec[i] = burstJob{j.kind, j.rate, j.callers / processes}.String()
	}
	env := []string{
		"WINDOW_ADDR=" + srv.Addr,
		"WINDOW_PREFIX=" + uniquePrefix("burst"),
		"WINDOW_JOBS=" + strings.Join(spec, ","),
	}

	type child struct {
		cmd    *exec.Cmd
		stdin  io.WriteCloser
		stdout *bufio.Reader
	}
	var children []child
	t.Cleanup(func() {
		for _, c := range children {
			if c.cmd.ProcessState == nil {
				c.cmd.Process.Kill()
				c.cmd.Wait()
			}
		}
	})
	for range processes {
		cmd := childproc.Command(t, burstRole, env...)
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		children = append(children, child{cmd, stdin, bufio.NewReader(stdout)})
	}
	readLine := func(t *testing.T, c child) string {
		line, err := c.stdout.ReadString('\n')
		if err != nil {
			t.Fatalf("reading from a child: %v (got %q)", err, line)
		}
		return strings.TrimSpace(line)
	}

	for _, job := range jobs {
		ok := t.Run(job.String(), func(t *testing.T) {
			for _, c := range children {
				if got := readLine(t, c); got != "ready" {
					t.Fatalf("child said %q, want ready", got)
				}
			}
			for _, c := range children {
				io.WriteString(c.stdin, "go\n")
			}
			var allowed, denied int64
			for _, c := range children {
				var a, d, failed int64
				line := readLine(t, c)
				if _, err := fmt.Sscan(line, &a, &d, &failed); err != nil {
					t.Fatalf("child said %q: %v", line, err)
				}
				if failed != 0 {
					t.Fatalf("a child had %d failed calls (see its log)", failed)
				}
				allowed += a
				denied += d
			}
			if allowed != job.rate || allowed+denied != job.callers {
				t.Errorf("got %d allowed and %d denied, want %d and %d", allowed, denied, job.rate, job.callers-job.rate)
			}
		})
		if !ok {
			return // the children are out of step; the cleanup stops them
		}
	}
	for _, c := range children {
		c.stdin.Close()
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("child: %v", err)
		}
	}
}

func runChild(role string) int {
	if role != burstRole {
		fmt.Fprintf(os.Stderr, "unknown child role %q\n", role)
		return 2
	}
	if err := burstChild(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// burstChild is one process of TestBurstAcrossProcesses. For each job in
// turn it connects, says "ready", waits for "go" on stdin, releases its
// callers at once and prints "allowed denied failed".
func burstChild() error {
	ctx := context.Background()
	in := bufio.NewReader(os.Stdin)
	var clients []*redis.Client
	for range 2 {
		c := redis.NewClient(&redis.Options{Addr: os.Getenv("WINDOW_ADDR"), PoolSize: 32})
		defer c.Close()
		if err := c.Ping(ctx).Err(); err != nil {
			return err
		}
		clients = append(clients, c)
	}
	for i, spec := range strings.Split(os.Getenv("WINDOW_JOBS"), ",") {
		var job burstJob
		parts := strings.Split(spec, ":")
		if len(parts) != 3 {
			return fmt.Errorf("bad job %q", spec)
		}
		job.kind = parts[0]
		job.rate, _ = strconv.ParseInt(parts[1], 10, 64)
		job.callers, _ = strconv.ParseInt(parts[2], 10, 64)
		var algo *algorithm
		for _, a := range algorithms() {
			if a.kind == job.kind {
				algo = &a
			}
		}
		if algo == nil {
			return fmt.Errorf("job %q: unknown kind", spec)
		}
		cfg := Config{Prefix: fmt.Sprintf("%s-%d", os.Getenv("WINDOW_PREFIX"), i)}
		if job.kind == "fw" {
			cfg.Now = func() time.Time { return time.UnixMicro(testNow) }
		}
		limit := Limit{Rate: job.rate, Per: time.Hour}
		var lims []subject
		for _, c := range clients {
			lim, err := algo.new(c, limit, cfg)
			if err != nil {
				return err
			}
			lims = append(lims, lim)
		}

		start := make(chan struct{})
		var allowed, denied, failed atomic.Int64
		var firstErr error
		var once sync.Once
		var wg sync.WaitGroup
		for i := range job.callers {
			wg.Go(func() {
				<-start
				res, err := lims[i%int64(len(lims))].Allow(ctx, "burst", 1)
				switch {
				case err != nil:
					failed.Add(1)
					once.Do(func() { firstErr = err })
				case res.Allowed:
					allowed.Add(1)
				default:
					denied.Add(1)
				}
			})
		}
		fmt.Println("ready")
		line, err := in.ReadString('\n')
		close(start)
		wg.Wait()
		if strings.TrimSpace(line) != "go" {
			return errors.Join(fmt.Errorf("got %q on stdin, want go", line), err)
		}
		fmt.Println(allowed.Load(), denied.Load(), failed.Load())
		if firstErr != nil {
			return firstErr
		}
	}
	return nil
}
