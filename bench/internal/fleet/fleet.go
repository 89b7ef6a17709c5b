// Package fleet runs the processes a product benchmark measures: shaper
// replicas (`shaper serve`, `shaper work`) as their users run them, and
// helper children of the benchmark's own executable (an asynq server for
// comparison, say). It also reads how much CPU each process has used, since
// on a small shared machine the processes of one measurement compete for
// the same cores and the split says where a ceiling comes from.
//
// Shaper runs from a binary built from this tree with `go build`, exactly as
// a user builds it. With profiling asked for, the same command line runs
// inside the benchmark's executable instead (the shaper binary cannot be
// told to profile itself), under a CPU profile written when it exits; call
// ServeChild first thing in main so that such a child does its work.
package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shaperhq/shaper/internal/cli"
)

// Environment variables a child of the benchmark's executable reads.
const (
	// EnvRole names what the child is to do; empty in the benchmark itself.
	EnvRole = "SHAPER_BENCH_ROLE"
	// EnvProfile is where a child writes its CPU profile; empty for none.
	EnvProfile = "SHAPER_BENCH_CPUPROFILE"
)

// roleShaper runs the shaper command line in the child.
const roleShaper = "shaper"

// ServeChild runs the shaper command line and exits if this process is a
// profiled shaper child; otherwise it returns at once.
func ServeChild() {
	if os.Getenv(EnvRole) != roleShaper {
		return
	}
	stop, err := StartProfile()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	code := cli.Main(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// StartProfile starts the CPU profile EnvProfile asks for, if any, and
// returns what stops and writes it.
func StartProfile() (stop func(), err error) {
	path := os.Getenv(EnvProfile)
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// Shaper starts shaper processes. Build one with Build.
type Shaper struct {
	bin        string
	profileDir string
	mu         sync.Mutex
	started    int
}

// Build compiles ./cmd/shaper of the main module into dir with `go build`.
func Build(ctx context.Context, dir string) (*Shaper, error) {
	root, err := mainModuleDir(ctx)
	if err != nil {
		return nil, err
	}
	bin := filepath.Join(dir, "shaper")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/shaper")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build ./cmd/shaper in %s: %v\n%s", root, err, out)
	}
	return &Shaper{bin: bin}, nil
}

// SourceDir is the shaper tree being benchmarked (bench/ is inside it).
func SourceDir(ctx context.Context) (string, error) { return mainModuleDir(ctx) }

// mainModuleDir is where the bench module's replace directive points: the
// shaper tree being benchmarked.
func mainModuleDir(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/shaperhq/shaper").Output()
	if err != nil {
		return "", fmt.Errorf("locate the shaper module (run from the bench module): %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// ProfileInto makes every later Start run shaper inside this executable
// under a CPU profile written to dir as <name>.pprof.
func (s *Shaper) ProfileInto(dir string) { s.profileDir = dir }

// Start runs shaper with args (e.g. "work", "--config", path) and extra
// environment entries ("KEY=value"). name labels its log and profile.
func (s *Shaper) Start(name string, env []string, args ...string) (*Proc, error) {
	if s.profileDir == "" {
		cmd := exec.Command(s.bin, args...)
		cmd.Env = append(os.Environ(), env...)
		return Start(name, cmd)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Env = append(cmd.Env, EnvRole+"="+roleShaper, EnvProfile+"="+filepath.Join(s.profileDir, name+".pprof"))
	return Start(name, cmd)
}

// Proc is a running child process whose output is kept for when it fails.
type Proc struct {
	Name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

// Start starts cmd. Its stderr is kept for Log; its stdout too, unless the
// caller has set cmd.Stdout or taken cmd.StdoutPipe. The child is killed if this
// process dies, so that no replica outlives a crashed benchmark.
func Start(name string, cmd *exec.Cmd) (*Proc, error) {
	p := &Proc{Name: name, cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	if cmd.Stdout == nil { // StdoutPipe sets it too
		cmd.Stdout = p.out
	}
	cmd.Stderr = p.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid is the child's process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the child has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Log is what the child wrote to stderr (and stdout, if kept).
func (p *Proc) Log() string { return p.out.String() }

// Stop asks the child to end with SIGTERM and waits up to grace before
// killing it. A child that had to be killed, or exited with an error, is
// reported with its log.
func (p *Proc) Stop(grace time.Duration) error {
	if p.Exited() {
		return p.exitError()
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.exitError()
	case <-time.After(grace):
		p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not stop within %v of SIGTERM; log:\n%s", p.Name, grace, tail(p.Log()))
	}
}

// Kill ends the child with SIGKILL, as a crash would (no shutdown of any
// kind), and waits until it has gone.
func (p *Proc) Kill() {
	if p.Exited() {
		return
	}
	p.cmd.Process.Kill()
	<-p.done
}

// Wait waits for the child to end by itself.
func (p *Proc) Wait() error {
	<-p.done
	return p.exitError()
}

func (p *Proc) exitError() error {
	if st := p.cmd.ProcessState; st != nil && !st.Success() {
		return fmt.Errorf("%s exited with %v; log:\n%s", p.Name, st, tail(p.Log()))
	}
	return nil
}

// CPU is the user plus system CPU time the child has used so far (or in
// all, once it has ended).
func (p *Proc) CPU() (time.Duration, error) {
	if p.Exited() {
		st := p.cmd.ProcessState
		return st.UserTime() + st.SystemTime(), nil
	}
	return CPUOf(p.Pid())
}

// clockTick is USER_HZ, which Linux fixes at 100 for /proc.
const clockTick = 10 * time.Millisecond

// CPUOf reads a process's user plus system CPU time from /proc.
func CPUOf(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces and parentheses; fields restart
	// after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("unexpected /proc stat format")
	}
	f := strings.Fields(s[i+1:])
	// utime and stime are fields 14 and 15 of the line, 12 and 13 after
	// the name.
	if len(f) < 13 {
		return 0, errors.New("unexpected /proc stat format")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * clockTick, nil
}

// SelfCPU is this process's CPU time so far.
func SelfCPU() (time.Duration, error) { return CPUOf(os.Getpid()) }

// StopAll stops every process, all at once so that a fleet's graceful
// shutdowns overlap, and joins their errors.
func StopAll(grace time.Duration, ps ...*Proc) error {
	errs := make([]error, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() { errs[i] = p.Stop(grace) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func tail(s string) string {
	const keep = 4000
	if len(s) > keep {
		return "…" + s[len(s)-keep:]
	}
	return s
}

// syncBuffer is a bytes.Buffer the child's two streams can share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	// A chatty child must not grow without bound over a long run.
	if b.b.Len() > 1<<20 {
		b.b.Reset()
		b.b.WriteString("[earlier output dropped]\n")
	}
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
