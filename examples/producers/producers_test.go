// Package producers_test runs the producer examples in other languages
// (python/produce.py, node/produce.mjs) against a real `shaper serve` and
// `shaper work` on a real Redis, through a proxy that checks every exchange
// against the OpenAPI document. Each producer meets the admission limit
// first, so the test also shows it waits out Retry-After as told.
package producers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shaperhq/shaper/internal/testsupport/apicheck"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

const apiKey = "k-producers"

// exchange is one request a producer made, as the proxy saw it answered.
type exchange struct {
	at         time.Time
	agent      string
	method     string
	path       string
	query      string
	status     int
	retryAfter string
}

// recorder keeps every exchange that passes through it.
type recorder struct {
	next http.RoundTripper
	mu   sync.Mutex
	log  []exchange
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	r.mu.Lock()
	r.log = append(r.log, exchange{at: time.Now(), agent: req.Header.Get("User-Agent"), method: req.Method,
		path: req.URL.Path, query: req.URL.RawQuery, status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")})
	r.mu.Unlock()
	return resp, nil
}

// by is the exchanges of one user agent, in order.
func (r *recorder) by(agent string) []exchange {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []exchange
	for _, e := range r.log {
		if e.agent == agent {
			out = append(out, e)
		}
	}
	return out
}

func TestProducers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs shaper serve and work, Python and Node: runs in make test")
	}
	producers := []struct {
		name, agent string
		cmd         func(args ...string) *exec.Cmd
	}{
		{"python", "shaper-example-python", func(args ...string) *exec.Cmd {
			return exec.Command(need(t, "python3"), append([]string{"python/produce.py"}, args...)...)
		}},
		{"node", "shaper-example-node", func(args ...string) *exec.Cmd {
			return exec.Command(need(t, "node"), append([]string{"node/produce.mjs"}, args...)...)
		}},
	}
	if out, err := exec.Command(need(t, "node"), "-p", "process.versions.node.split('.')[0]").Output(); err != nil {
		t.Fatalf("node: %v", err)
	} else if major, _ := strconv.Atoi(strings.TrimSpace(string(out))); major < 18 {
		// The example is written for Node 20; what it uses (fetch,
		// parseArgs, AbortSignal.timeout) is in 18 too, which is Debian 12's.
		t.Fatalf("got node %s, want 18 or later (built-in fetch)", strings.TrimSpace(string(out)))
	}

	bin := filepath.Join(t.TempDir(), "shaper")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/shaper").CombinedOutput(); err != nil {
		t.Fatalf("building shaper: %v\n%s", err, out)
	}
	rs := redistest.New(t)

	// The upstream answers each call with what it received.
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"method": r.Method, "path": r.URL.Path, "received": string(body)})
	}))
	t.Cleanup(upstream.Close)

	// One admission token, refilled every two seconds: a producer that
	// enqueues right after another request meets a 429.
	cfg := filepath.Join(t.TempDir(), "shaper.yaml")
	yaml := fmt.Sprintf(`
redis: {url: %q}
api:
  keys: [{name: producer, key_env: SHAPER_KEY_PRODUCER}]
  admission: {capacity: 1, refill_per_second: 0.5}
upstreams:
  echo:
    base_url: %q
    limits: [{rate: 50, per: 1s}]
`, rs.URL(), upstream.URL)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	start(t, bin, "serve", "--config", cfg, "--listen", addr, "--log-level", "warn")
	start(t, bin, "work", "--config", cfg, "--metrics-listen", "off", "--log-level", "warn")

	chk, err := apicheck.New()
	if err != nil {
		t.Fatal(err)
	}
	serve := &url.URL{Scheme: "http", Host: addr}
	rec := &recorder{next: chk.Transport(t, nil)}
	proxy := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(serve) },
		Transport: rec,
	})
	t.Cleanup(proxy.Close)
	api := chk.Client(t)
	waitReady(t, api, "http://"+addr)

	for _, p := range producers {
		t.Run(p.name, func(t *testing.T) {
			spendToken(t, api, proxy.URL)
			body := "hello from " + p.name
			cmd := p.cmd("--api", proxy.URL, "--upstream", "echo", "--path", "/charges/"+p.name,
				"--body", body, "--header", "Content-Type: text/plain", "--timeout", "60")
			cmd.Env = append(os.Environ(), "SHAPER_API_KEY="+apiKey)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", p.name, err, stdout.String(), stderr.String())
			}
			var job struct {
				State    string `json:"state"`
				Upstream string `json:"upstream"`
				Path     string `json:"path"`
				Response struct {
					Status int    `json:"status"`
					Body   string `json:"body"`
				} `json:"response"`
			}
			if err := json.Unmarshal(stdout.Bytes(), &job); err != nil {
				t.Fatalf("%s printed %q, want the job as JSON: %v", p.name, stdout.String(), err)
			}
			var echoed struct{ Method, Path, Received string }
			json.Unmarshal([]byte(job.Response.Body), &echoed)
			if job.State != "succeeded" || job.Response.Status != 200 || echoed.Received != body ||
				echoed.Path != "/charges/"+p.name || echoed.Method != "POST" {
				t.Fatalf("%s: got job %+v (upstream received %+v), want succeeded with a 200 to POST /charges/%s of %q",
					p.name, job, echoed, p.name, body)
			}
			checkWaited(t, rec.by(p.agent), stderr.String())
		})
	}
}

// checkWaited holds a producer's exchanges to the admission path: its
// enqueue met a 429, each retry came no sooner than the Retry-After it
// was given, the last enqueue was accepted, and then it read the job back
// with long polls: every GET waits on the server, and since the job
// finishes within the first window, there is one (a polling loop would
// make several).
func checkWaited(t *testing.T, log []exchange, stderr string) {
	t.Helper()
	var enqueues []exchange
	gets := 0
	for _, e := range log {
		switch {
		case e.method == "POST" && e.path == "/v1/jobs":
			enqueues = append(enqueues, e)
		case e.method == "GET" && strings.HasPrefix(e.path, "/v1/jobs/"):
			gets++
			if q, _ := url.ParseQuery(e.query); q.Get("wait") == "" {
				t.Errorf("GET %s?%s: no wait, a poll rather than a long poll", e.path, e.query)
			}
		}
	}
	if len(enqueues) < 2 || enqueues[0].status != http.StatusTooManyRequests || enqueues[len(enqueues)-1].status != http.StatusAccepted {
		t.Fatalf("got enqueues %+v, want a 429 first and a 202 last; stderr:\n%s", enqueues, stderr)
	}
	for i, e := range enqueues[:len(enqueues)-1] {
		secs, err := strconv.Atoi(e.retryAfter)
		if e.status != http.StatusTooManyRequests || err != nil {
			t.Fatalf("enqueue %d: got %d with Retry-After %q, want 429 with whole seconds", i, e.status, e.retryAfter)
		}
		// The proxy stamps an exchange once it is answered, a little after
		// the producer heard it: a millisecond of slack for that.
		if gap, want := enqueues[i+1].at.Sub(e.at), time.Duration(secs)*time.Second-time.Millisecond; gap < want {
			t.Errorf("enqueue %d came %v after a 429 with Retry-After %d, want at least that long", i+1, gap, secs)
		}
	}
	if gets != 1 {
		t.Errorf("got %d GET /v1/jobs/{id}, want 1: one long poll for a job that finishes within its window; stderr:\n%s", gets, stderr)
	}
}

// spendToken takes the key's one admission token with an enqueue of its
// own, waiting for it if an earlier request took it.
func spendToken(t *testing.T, api *http.Client, base string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequest("POST", base+"/v1/jobs", strings.NewReader(`{"upstream":"echo","path":"/warm-up"}`))
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := api.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusAccepted:
			return
		case http.StatusTooManyRequests:
			secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			time.Sleep(time.Duration(max(secs, 1)) * time.Second)
		default:
			t.Fatalf("warm-up enqueue: got %d, want 202 or 429", resp.StatusCode)
		}
	}
	t.Fatal("the admission token never came back")
}

// need is the path of a program the test runs; scripts/test.sh installs
// python3 and nodejs from Debian's packages when they are missing.
func need(t *testing.T, prog string) string {
	t.Helper()
	path, err := exec.LookPath(prog)
	if err != nil {
		t.Fatalf("%s not found: install it (Debian: apt-get install python3 nodejs; scripts/test.sh does it)", prog)
	}
	return path
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// start runs the shaper binary until the test ends, then stops it with
// SIGTERM (SIGKILL after 10 s); its output is shown if the test failed.
func start(t *testing.T, bin string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "SHAPER_KEY_PRODUCER="+apiKey)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("shaper %s:\n%s", args[0], out.String())
		}
	})
}

func waitReady(t *testing.T, api *http.Client, base string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+"/readyz", nil)
		if resp, err := api.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("shaper serve did not become ready")
}
