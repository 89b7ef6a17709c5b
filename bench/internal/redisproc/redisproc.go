// Package redisproc runs the benchmarks' own redis-server: a fresh process
// on a free loopback port, without persistence unless asked for, so that a
// measurement sees no one else's keys, clients or saves, and leaves nothing
// behind. A server with an append-only file can be crashed (SIGKILL) and
// started again on the same port and directory, so that it reloads what
// the file kept: what a real Redis crash and restart look like to clients.
package redisproc

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Server is a running redis-server. Stop it when done.
type Server struct {
	// Addr is host:port on the loopback interface.
	Addr string
	// Version is what the server calls itself, e.g. "Redis 7.0.15".
	Version string

	dir  string
	path string
	args []string
	cmd  *exec.Cmd
}

// Options shape the server. The zero value is what Start runs: no
// persistence at all.
type Options struct {
	// AppendFsync turns the append-only file on with this fsync policy
	// ("always", "everysec" or "no"); empty leaves it off.
	AppendFsync string
}

// Start launches redis-server from PATH without persistence and waits
// until it answers.
func Start() (*Server, error) { return StartWith(Options{}) }

// StartWith launches redis-server from PATH as opts say and waits until it
// answers.
func StartWith(opts Options) (*Server, error) {
	path, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found in PATH: install it with `apt-get install -y redis-server`")
	}
	// The port is free now; another process could take it before
	// redis-server binds, which then fails to start and we say so.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "shaper-bench-redis-")
	if err != nil {
		return nil, err
	}
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--protected-mode", "no", "--loglevel", "warning"}
	if opts.AppendFsync != "" {
		args = append(args, "--appendonly", "yes", "--appendfsync", opts.AppendFsync)
	}
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, path: path, args: args}
	if err := s.launch(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := s.waitReady(10 * time.Second); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

func (s *Server) launch() error {
	cmd := exec.Command(s.path, s.args...)
	// A benchmark that dies must not leave its server behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd = cmd
	return nil
}

// waitReady waits until the server answers and has finished loading its
// data, if any.
func (s *Server) waitReady(within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		info, err := s.Info("server")
		if err == nil {
			s.Version = "Redis " + info["redis_version"]
			p, perr := s.Info("persistence")
			if perr == nil && p["loading"] == "0" {
				return nil
			}
			err = perr
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s not ready within %v: %v", s.Addr, within, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Crash kills the server with SIGKILL, as a crash would: no shutdown, no
// final write or fsync. Its directory stays for Restart.
func (s *Server) Crash() {
	s.cmd.Process.Kill()
	s.cmd.Wait()
}

// Pid is the running server's process id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// AOFTail names the append-only file Redis is writing to now (the last
// "incr" file of its manifest, Redis 7's multi-part AOF) and its size.
func (s *Server) AOFTail() (file string, size int64, err error) {
	adir := filepath.Join(s.dir, "appendonlydir")
	matches, err := filepath.Glob(filepath.Join(adir, "*.manifest"))
	if err != nil || len(matches) != 1 {
		return "", 0, fmt.Errorf("no single AOF manifest in %s (%v)", adir, err)
	}
	m, err := os.ReadFile(matches[0])
	if err != nil {
		return "", 0, err
	}
	for _, line := range strings.Split(string(m), "\n") {
		f := strings.Fields(line)
		// file NAME seq N type i
		if len(f) >= 6 && f[0] == "file" && f[len(f)-2] == "type" && f[len(f)-1] == "i" {
			file = f[1]
		}
	}
	if file == "" {
		return "", 0, fmt.Errorf("AOF manifest %s names no incr file", matches[0])
	}
	st, err := os.Stat(filepath.Join(adir, file))
	if err != nil {
		return "", 0, err
	}
	return file, st.Size(), nil
}

// TruncateAOF cuts the current append-only file back to size if it is
// still file, or to nothing if Redis has moved on to a newer one since:
// what a power loss does to writes that were never fsynced. Call it between
// Crash and Restart; Redis loads a file cut mid-command up to its last
// whole command (aof-load-truncated, on by default). It returns how many
// bytes were dropped.
func (s *Server) TruncateAOF(file string, size int64) (int64, error) {
	cur, now, err := s.AOFTail()
	if err != nil {
		return 0, err
	}
	if cur != file {
		size = 0
	}
	if size >= now {
		return 0, nil
	}
	if err := os.Truncate(filepath.Join(s.dir, "appendonlydir", cur), size); err != nil {
		return 0, err
	}
	return now - size, nil
}

// Restart starts the server again after Crash, on the same port and
// directory, so that it loads its append-only file, and waits until it has
// loaded it (up to within).
func (s *Server) Restart(within time.Duration) error {
	if err := s.launch(); err != nil {
		return err
	}
	return s.waitReady(within)
}

// Info returns the fields of one INFO section ("memory", "server", ...).
// It speaks to the server on its own short connection, so it works before
// any client is set up and adds nothing to a client pool being measured.
func (s *Server) Info(section string) (map[string]string, error) {
	c, err := net.DialTimeout("tcp", s.Addr, 200*time.Millisecond)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "INFO %s\r\n", section); err != nil {
		return nil, err
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	head = strings.TrimSpace(head)
	if !strings.HasPrefix(head, "$") {
		return nil, fmt.Errorf("INFO %s: unexpected reply %q", section, head)
	}
	n, err := strconv.Atoi(head[1:])
	if err != nil || n < 0 {
		return nil, fmt.Errorf("INFO %s: unexpected reply %q", section, head)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	fields := map[string]string{}
	for _, line := range strings.Split(string(body), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && !strings.HasPrefix(k, "#") {
			fields[k] = v
		}
	}
	return fields, nil
}

// UsedMemory is INFO's used_memory: every byte Redis has allocated,
// including the buffers of connected clients.
func (s *Server) UsedMemory() (int64, error) {
	info, err := s.Info("memory")
	if err != nil {
		return 0, err
	}
	v, ok := info["used_memory"]
	if !ok {
		return 0, fmt.Errorf("INFO memory has no used_memory")
	}
	return strconv.ParseInt(v, 10, 64)
}

// Stop kills the server and removes its directory.
func (s *Server) Stop() {
	s.cmd.Process.Kill()
	s.cmd.Wait()
	os.RemoveAll(s.dir)
}
