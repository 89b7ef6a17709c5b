package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/shaperhq/shaper/bench/internal/fleet"
)

// bullmqQueue is the BullMQ queue the ceiling drains. Its keys are
// bull:bench-noop:*, apart from asynq's asynq:* and shaper's, and every
// measurement starts on a flushed Redis anyway.
const bullmqQueue = "bench-noop"

// bullmq runs the BullMQ contender: bench/node/bullmq.mjs under node, with
// the BullMQ that bench/node's package-lock.json pins.
type bullmq struct {
	node   string // the node executable
	script string // bench/node/bullmq.mjs
}

// findBullMQ makes the BullMQ contender ready: node and npm on PATH, and
// bench/node's packages installed (`npm ci` when node_modules is missing).
// Without node or npm it returns why, and no error: the ceiling runs
// without BullMQ.
func findBullMQ(ctx context.Context) (bq *bullmq, skip string, err error) {
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, "node is not on PATH", nil
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return nil, "npm is not on PATH", nil
	}
	root, err := fleet.SourceDir(ctx)
	if err != nil {
		return nil, "", err
	}
	dir := filepath.Join(root, "bench", "node")
	if _, err := os.Stat(filepath.Join(dir, "node_modules")); errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(os.Stderr, "ceiling: %s has no node_modules: running `npm ci` there (installs the BullMQ its package-lock.json pins)…\n", dir)
		cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return nil, "", fmt.Errorf("npm ci in %s: %w", dir, err)
		}
	} else if err != nil {
		return nil, "", err
	}
	return &bullmq{node: node, script: filepath.Join(dir, "bullmq.mjs")}, "", nil
}

// version is the BullMQ installed, as its package.json says.
func (bq *bullmq) version() string {
	b, err := os.ReadFile(filepath.Join(filepath.Dir(bq.script), "node_modules", "bullmq", "package.json"))
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), `"version": "`); ok {
			return strings.TrimSuffix(strings.TrimSuffix(v, ","), `"`)
		}
	}
	return "?"
}

// fill adds n jobs carrying payload (JSON) with BullMQ's Queue.addBulk.
func (bq *bullmq) fill(ctx context.Context, redisURL string, n int, payload []byte) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bq.node, bq.script, "fill", "--redis", redisURL, "--queue", bullmqQueue,
		"--jobs", strconv.Itoa(n), "--payload", string(payload))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("bullmq fill: %v\n%s", err, out)
	}
	if want := fmt.Sprintf("filled %d", n); !strings.Contains(string(out), want) {
		return fmt.Errorf("bullmq fill: no %q in its output:\n%s", want, out)
	}
	return nil
}

// start starts one BullMQ worker process with concurrency jobs in flight,
// ready to take jobs once told to (child.start);
// with url, its processor sends each job's request there first.
func (bq *bullmq) start(name, redisURL string, concurrency int, url string) (*child, error) {
	args := []string{bq.script, "work", "--redis", redisURL, "--queue", bullmqQueue, "--concurrency", strconv.Itoa(concurrency)}
	if url != "" {
		args = append(args, "--url", url)
	}
	return startReporting(name, exec.Command(bq.node, args...))
}

// nodeVersion is what `node --version` prints.
func nodeVersion(node string) string {
	out, err := exec.Command(node, "--version").Output()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(out))
}
