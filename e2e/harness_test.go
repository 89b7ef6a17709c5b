// Package e2e tests shaper as users run it: real `shaper` processes built
// from this tree, a real redis-server, and the fake third-party API from
// package fakeupstream listening on this host.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/config"
	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/internal/testsupport/apicheck"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/queue"
)

// shaperBin is the shaper binary built for this test run.
var shaperBin string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		// Every test here runs shaper processes and skips itself under
		// -short, so building the binary would only cost time.
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "shaper-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	shaperBin = filepath.Join(dir, "shaper")
	build := exec.Command("go", "build", "-o", shaperBin, "../cmd/shaper")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building shaper: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// env is one test's world: a Redis, a fake upstream, a config file.
type env struct {
	t      *testing.T
	redis  *redistest.Server
	rdb    *redis.Client
	fake   *fakeupstream.Server
	fakeHS *httptest.Server
	dir    string
	cfg    string
	q      *queue.Queue
	// api is the HTTP client for the API of every `shaper serve` the test
	// starts: each exchange is checked against the OpenAPI document.
	api *http.Client

	mu      sync.Mutex
	workers []*worker
}

type worker struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  *bytes.Buffer
}

func newEnv(t *testing.T, fakeCfg fakeupstream.Config, redisOpts redistest.Options) *env {
	t.Helper()
	e := &env{t: t, redis: redistest.New(t, redisOpts), dir: t.TempDir(), api: checkedClient(t)}
	e.rdb = e.redis.Client(t)
	fake, err := fakeupstream.New(fakeCfg)
	if err != nil {
		t.Fatal(err)
	}
	e.fake = fake
	e.fakeHS = httptest.NewServer(fake)
	t.Cleanup(e.fakeHS.Close)
	t.Cleanup(e.stopAll)
	return e
}

// checkedClient is an HTTP client for shaper's API that checks every
// exchange against the OpenAPI document (internal/testsupport/apicheck) and fails t on
// a mismatch.
func checkedClient(t *testing.T) *http.Client {
	t.Helper()
	chk, err := apicheck.New()
	if err != nil {
		t.Fatal(err)
	}
	return chk.Client(t)
}

// writeConfig writes the config with {{REDIS}} and {{UPSTREAM}} filled in
// and opens a queue on it.
func (e *env) writeConfig(yaml string) {
	e.t.Helper()
	yaml = strings.ReplaceAll(yaml, "{{REDIS}}", e.redis.URL())
	yaml = strings.ReplaceAll(yaml, "{{UPSTREAM}}", e.fakeHS.URL)
	e.cfg = filepath.Join(e.dir, "shaper.yaml")
	if err := os.WriteFile(e.cfg, []byte(yaml), 0o600); err != nil {
		e.t.Fatal(err)
	}
	cfg, err := config.Load(e.cfg, func(string) (string, bool) { return "", false })
	if err != nil {
		e.t.Fatalf("test config: %v", err)
	}
	q, err := queue.New(e.rdb, queue.Config{Upstreams: cfg.AllUpstreams()})
	if err != nil {
		e.t.Fatal(err)
	}
	e.q = q
	e.t.Cleanup(func() { q.Close() })
}

// startWorker runs `shaper work` and returns it.
func (e *env) startWorker(args ...string) *worker {
	e.t.Helper()
	return e.startProc(nil, append([]string{"work", "--config", e.cfg, "--metrics-listen", "off", "--log-level", "warn"}, args...)...)
}

// startProc runs the shaper binary with args (and extra environment), to be
// stopped when the test ends.
func (e *env) startProc(environ []string, args ...string) *worker {
	e.t.Helper()
	cmd := exec.Command(shaperBin, args...)
	cmd.Env = append(os.Environ(), environ...)
	w := &worker{cmd: cmd, done: make(chan struct{}), log: &bytes.Buffer{}}
	cmd.Stdout = w.log
	cmd.Stderr = w.log
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() {
		cmd.Wait()
		close(w.done)
	}()
	e.mu.Lock()
	e.workers = append(e.workers, w)
	e.mu.Unlock()
	return w
}

// stop sends SIGTERM and waits for a graceful exit.
func (w *worker) stop(t *testing.T) {
	t.Helper()
	w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.done:
	case <-time.After(60 * time.Second):
		w.cmd.Process.Kill()
		t.Errorf("worker did not stop within 60s of SIGTERM; log:\n%s", w.log)
	}
	if st := w.cmd.ProcessState; st != nil && !st.Success() {
		t.Errorf("worker exited with %v; log:\n%s", st, w.log)
	}
}

// kill ends a worker with SIGKILL, as a crash would.
func (w *worker) kill() {
	w.cmd.Process.Kill()
	<-w.done
}

func (e *env) stopAll() {
	e.mu.Lock()
	ws := e.workers
	e.workers = nil
	e.mu.Unlock()
	for _, w := range ws {
		select {
		case <-w.done:
		default:
			w.stop(e.t)
		}
	}
}

// enqueue puts n jobs on the upstream, made by mk.
func (e *env) enqueue(n int, mk func(i int) *queue.Job) []string {
	e.t.Helper()
	ids := make([]string, n)
	for i := range ids {
		info, _, err := e.q.Enqueue(context.Background(), mk(i))
		if err != nil {
			e.t.Fatal(err)
		}
		ids[i] = info.ID
	}
	return ids
}

// waitDone waits until every job is finished (succeeded or dead) and
// returns them. The deadline only stops a hang; outcomes are what count.
func (e *env) waitDone(ids []string, within time.Duration) map[string]*queue.Info {
	e.t.Helper()
	deadline := time.Now().Add(within)
	out := map[string]*queue.Info{}
	for {
		for _, id := range ids {
			if out[id] != nil {
				continue
			}
			info, err := e.q.Get(context.Background(), id, "")
			if err != nil {
				continue // Redis may be restarting
			}
			if info.State == queue.StateSucceeded || info.State == queue.StateDead {
				out[id] = info
			}
		}
		if len(out) == len(ids) {
			return out
		}
		if time.Now().After(deadline) {
			e.mu.Lock()
			for i, w := range e.workers {
				e.t.Logf("worker %d log:\n%s", i, w.log)
			}
			e.mu.Unlock()
			e.t.Fatalf("after %v only %d of %d jobs finished", within, len(out), len(ids))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitUntil polls cond until it holds or the deadline passes.
func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s after %v", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// commandsProcessed is Redis's total_commands_processed (INFO stats): every
// command any client ran, the INFO that reads it included.
func (e *env) commandsProcessed() int64 {
	e.t.Helper()
	info, err := e.rdb.Info(context.Background(), "stats").Result()
	if err != nil {
		e.t.Fatal(err)
	}
	n, ok := infoField(info, "total_commands_processed")
	if !ok {
		e.t.Fatalf("INFO stats has no total_commands_processed:\n%s", info)
	}
	return n
}

// commandCalls is INFO commandstats: calls by command name ("evalsha"), to
// say where the commands went when a count is too high.
func (e *env) commandCalls() map[string]int64 {
	e.t.Helper()
	info, err := e.rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		e.t.Fatal(err)
	}
	calls := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		// cmdstat_evalsha:calls=12,usec=34,usec_per_call=2.83,...
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		cmd, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd {
			continue
		}
		if n, ok := infoField(strings.ReplaceAll(rest, ",", "\n"), "calls"); ok {
			calls[cmd] = n
		}
	}
	return calls
}

// callsSince is the growth of each command's calls from before to after,
// commands that did not grow left out.
func callsSince(before, after map[string]int64) map[string]int64 {
	d := map[string]int64{}
	for k, v := range after {
		if v > before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}

// infoField reads an integer field "name:N" (or "name=N") from INFO text.
func infoField(info, name string) (int64, bool) {
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		v, ok := strings.CutPrefix(line, name+":")
		if !ok {
			v, ok = strings.CutPrefix(line, name+"=")
		}
		if ok {
			n, err := strconv.ParseInt(v, 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// monitor counts the commands Redis runs from now until the returned stop
// is called, telling the ones clients sent (each a round trip, or part of
// a pipeline) from the ones Lua scripts ran inside an EVALSHA. INFO counts
// both alike; MONITOR marks the latter "lua". (A raw connection: go-redis
// v9.23's pool drops a MONITOR connection as having unread data.)
func (e *env) monitor() (stop func() (client, lua int)) {
	e.t.Helper()
	conn, err := net.Dial("tcp", e.rdb.Options().Addr)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		e.t.Fatal(err)
	}
	rd := bufio.NewReader(conn)
	if line, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
		e.t.Fatalf("MONITOR: %q, %v", line, err)
	}
	var client, lua int
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				return
			}
			if strings.Contains(line, " lua] ") {
				lua++
			} else {
				client++
			}
		}
	}()
	return func() (int, int) {
		// Let the lines already sent arrive, then stop reading.
		time.Sleep(100 * time.Millisecond)
		conn.Close()
		<-done
		return client, lua
	}
}
