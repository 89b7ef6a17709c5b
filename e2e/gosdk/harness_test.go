package gosdk

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

// shaperBin is the shaper binary built from this tree for the test run.
var shaperBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "shaper-gosdk-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	shaperBin = filepath.Join(dir, "shaper")
	build := exec.Command("go", "build", "-o", shaperBin, "./cmd/shaper")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building shaper: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// The caller's shaper key, and the upstreams' real secrets, which only
// shaper holds.
const (
	shaperKey    = "shaper-key-gosdk"
	openAISecret = "sk-upstream-openai"
	stripeSecret = "sk_test_upstream_stripe"
)

// world is one test's Redis, fake vendor upstream and `shaper serve`.
type world struct {
	fake   *fakeupstream.Server
	vendor *fakeupstream.Vendor
	// base is the serve's URL: the proxy is at base + "/proxy/NAME".
	base string
	// stripe is the URL of the stripe upstream's own proxy listener.
	stripe string
}

// start runs a Redis, the fake upstream (limited to rate per second per
// secret when rate > 0) and one `shaper serve` proxying upstreams openai
// and stripe to it at rate per second, stripe also on a listener of its
// own.
func start(t *testing.T, rate int, vendor fakeupstream.VendorOptions) *world {
	t.Helper()
	rs := redistest.New(t)
	fake, err := fakeupstream.New(fakeupstream.Config{Rate: int64(rate), Per: time.Second, Style: fakeupstream.StyleOpenAI})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{fake: fake, vendor: fake.Vendor(vendor)}
	hs := httptest.NewServer(w.vendor)
	t.Cleanup(hs.Close)
	limit := rate
	if limit == 0 {
		limit = 1000
	}
	stripeListen := freeAddr(t)
	cfg := filepath.Join(t.TempDir(), "shaper.yaml")
	yaml := fmt.Sprintf(`
redis: {url: "%[1]s"}
api:
  keys: [{name: app, tenant: app, key_env: GOSDK_KEY}]
upstreams:
  openai:
    base_url: "%[2]s"
    limits: [{rate: %[3]d, per: 1s}]
    headers: {Authorization: "Bearer %[4]s"}
    proxy: {enabled: true, max_wait: 30s}
  stripe:
    base_url: "%[2]s"
    limits: [{rate: %[3]d, per: 1s}]
    headers: {Authorization: "Bearer %[5]s"}
    proxy: {enabled: true, listen: "%[6]s"}
`, rs.URL(), hs.URL, limit, openAISecret, stripeSecret, stripeListen)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	startServe(t, cfg, addr)
	w.base = "http://" + addr
	w.stripe = "http://" + stripeListen
	return w
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

// startServe runs `shaper serve` until the test ends and waits until it
// is ready.
func startServe(t *testing.T, cfg, addr string) {
	t.Helper()
	cmd := exec.Command(shaperBin, "serve", "--config", cfg, "--listen", addr, "--log-level", "warn")
	cmd.Env = append(os.Environ(), "GOSDK_KEY="+shaperKey)
	var log syncBuffer
	cmd.Stdout, cmd.Stderr = &log, &log
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
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Errorf("shaper serve did not stop within 30s of SIGTERM; log:\n%s", log.String())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		select {
		case <-done:
			t.Fatalf("shaper serve exited: %v; log:\n%s", cmd.ProcessState, log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("shaper serve not ready after 30s; log:\n%s", log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkUpstreamSaw fails t unless every request at the vendor's endpoints
// carried one of the upstreams' secrets, and none a Shaper-* header or the
// caller's shaper key.
func checkUpstreamSaw(t *testing.T, v *fakeupstream.Vendor) {
	t.Helper()
	for i, h := range v.Headers() {
		if auth := h.Get("Authorization"); auth != "Bearer "+openAISecret && auth != "Bearer "+stripeSecret {
			t.Errorf("request %d reached the upstream with Authorization %q, want the upstream's configured secret", i, auth)
		}
		for name, vals := range h {
			if strings.HasPrefix(strings.ToLower(name), "shaper-") {
				t.Errorf("request %d reached the upstream with %s: %q; no Shaper-* header may", i, name, vals)
			}
			if strings.Contains(strings.Join(vals, " "), shaperKey) {
				t.Errorf("request %d reached the upstream with the caller's shaper key in %s", i, name)
			}
		}
	}
}

// syncBuffer is a bytes.Buffer safe for a process's output and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
