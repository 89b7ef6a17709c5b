// Package redistest starts real redis-server processes for tests: a single
// server on a free loopback port, or a 3-master Redis Cluster. Nothing is
// mocked. A missing redis-server binary is a test failure with a message
// that says how to install it, never a silent skip.
//
// A package usually starts one server in TestMain with Main and hands each
// test a client with (*Server).Client; tests that restart or break Redis
// start their own with New.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// InstallHint is what a test prints when redis-server or redis-cli is missing.
const InstallHint = "install it with `apt-get install -y redis-server redis-tools`, or run `make test`, which does"

// Options adjust a server before it starts.
type Options struct {
	// AppendOnly turns on AOF persistence (appendfsync always), so a
	// restarted server has every acknowledged write.
	AppendOnly bool
	// Args are extra redis-server arguments, e.g. {"--maxmemory", "10mb"}.
	Args []string
	// Port pins the port; zero picks a free one.
	Port int
}

// Server is one redis-server process owned by the test binary.
type Server struct {
	Addr string
	Port int
	Dir  string

	opts    Options
	cluster bool

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited and been reaped
}

// Start launches redis-server on a free loopback port and waits until it
// answers PING. The caller must Close it.
func Start(opts Options) (*Server, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("redis-server not found in PATH: %s", InstallHint)
	}
	dir, err := os.MkdirTemp("", "shaper-redis-")
	if err != nil {
		return nil, err
	}
	s := &Server{Dir: dir, opts: opts}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port := opts.Port
		if port == 0 {
			if port, err = freePort(false); err != nil {
				return nil, err
			}
		}
		s.Port = port
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if lastErr = s.start(); lastErr == nil {
			return s, nil
		}
		if opts.Port != 0 {
			break
		}
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

// New starts a server for one test and stops it when the test ends.
func New(tb testing.TB, opts ...Options) *Server {
	tb.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	s, err := Start(o)
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// Main runs a test binary with one shared server started before the tests
// and stopped after them, then fails the run if goroutines leaked. Use it
// from TestMain:
//
//	var srv *redistest.Server
//	func TestMain(m *testing.M) { redistest.Main(m, &srv) }
//
// It calls os.Exit, so TestMain must do nothing after it.
func Main(m interface{ Run() int }, srv **Server) {
	s, err := Start(Options{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "redistest: %v\n", err)
		os.Exit(1)
	}
	*srv = s
	code := m.Run()
	s.Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "redistest: goroutines leaked: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func (s *Server) args() []string {
	a := []string{
		"--port", strconv.Itoa(s.Port),
		"--bind", "127.0.0.1",
		"--dir", s.Dir,
		"--save", "",
		"--daemonize", "no",
		"--protected-mode", "no",
		"--loglevel", "warning",
		"--logfile", "",
	}
	if s.opts.AppendOnly {
		a = append(a, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		a = append(a, "--appendonly", "no")
	}
	if s.cluster {
		a = append(a, "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(s.Dir, "nodes.conf"),
			"--cluster-node-timeout", "2000")
	}
	return append(a, s.opts.Args...)
}

func (s *Server) start() error {
	logf, err := os.OpenFile(filepath.Join(s.Dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command("redis-server", s.args()...)
	if dir := os.Getenv(CallgrindEnv); dir != "" {
		// Counted, not timed: see Instructions.
		cmd = exec.Command("valgrind", append([]string{"--tool=callgrind", "--dump-instr=no",
			"--callgrind-out-file=" + filepath.Join(dir, "redis.%p.out"), "redis-server"}, s.args()...)...)
	}
	cmd.Stdout = logf
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start redis-server: %w", err)
	}
	exited := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		exited <- cmd.Wait()
		logf.Close()
		close(done)
	}()

	deadline := time.Now().Add(10 * time.Second)
	if os.Getenv(CallgrindEnv) != "" {
		deadline = deadline.Add(50 * time.Second) // valgrind starts slowly
	}
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("redis-server on port %d exited at start (%v): %s", s.Port, err, tail(filepath.Join(s.Dir, "redis.log")))
		default:
		}
		if ping(s.Addr) == nil {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-done
			return fmt.Errorf("redis-server on port %d did not answer PING within 10s: %s", s.Port, tail(filepath.Join(s.Dir, "redis.log")))
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	return nil
}

// Stop shuts the server down gracefully (SHUTDOWN, writing the AOF) and
// waits for it to exit. Restart brings it back on the same port and data.
func (s *Server) Stop() error {
	cmd, done := s.take()
	if cmd == nil {
		return nil
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	c.Shutdown(context.Background())
	c.Close()
	return waitExit(cmd, done)
}

// Kill stops the server with SIGKILL, as a crash would.
func (s *Server) Kill() error {
	cmd, done := s.take()
	if cmd == nil {
		return nil
	}
	cmd.Process.Kill()
	return waitExit(cmd, done)
}

// Restart starts a stopped or killed server again on the same port and
// directory; with AppendOnly its data survives.
func (s *Server) Restart() error {
	if s.Running() {
		if err := s.Stop(); err != nil {
			return err
		}
	}
	var err error
	// The old socket may linger for a moment after the process exits.
	for i := 0; i < 50; i++ {
		if err = s.start(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// Close kills the server and removes its directory.
func (s *Server) Close() error {
	err := s.Kill()
	os.RemoveAll(s.Dir)
	return err
}

// Client returns a client for this server, closed when the test ends.
func (s *Server) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	tb.Cleanup(func() { c.Close() })
	return c
}

// URL is the server's redis:// URL.
func (s *Server) URL() string { return "redis://" + s.Addr + "/0" }

func (s *Server) take() (*exec.Cmd, chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	return cmd, done
}

// Running reports whether the server process is up (as far as this package
// knows: it was started and has not been stopped, killed or seen to exit).
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

func waitExit(cmd *exec.Cmd, done chan struct{}) error {
	select {
	case <-done:
		return nil
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
		return errors.New("redis-server did not exit within 10s; killed")
	}
}

func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

// freePort finds a loopback port nobody listens on. With bus set, port+10000
// (Redis Cluster's bus port) must be free too.
func freePort(bus bool) (int, error) {
	for i := 0; i < 200; i++ {
		var port int
		if bus {
			port = 20000 + rand.IntN(25000)
		} else {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return 0, err
			}
			port = l.Addr().(*net.TCPAddr).Port
			l.Close()
		}
		if !portFree(port) || (bus && !portFree(port+10000)) {
			continue
		}
		return port, nil
	}
	return 0, errors.New("no free loopback port found")
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log)"
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 2000 {
		s = s[len(s)-2000:]
	}
	if s == "" {
		return "(empty log)"
	}
	return s
}

// UsedMemory is the server's INFO memory used_memory, in bytes, as rdb
// reads it now; it fails the test if Redis does not say.
func UsedMemory(tb testing.TB, rdb redis.UniversalClient) int64 {
	tb.Helper()
	info, err := rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				tb.Fatal(err)
			}
			return n
		}
	}
	tb.Fatal("no used_memory in INFO memory")
	return 0
}

// CommandCalls is how many times s has run each command, by its name in
// lower case, from INFO commandstats. Each call opens a connection of its
// own, whose HELLO and INFO count among them.
func (s *Server) CommandCalls(tb testing.TB) map[string]int64 {
	tb.Helper()
	info, err := s.Client(tb).Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		v, _, _ := strings.Cut(rest, ",")
		n, _ := strconv.ParseInt(v, 10, 64)
		out[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return out
}
