package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/queue"
)

// The vendors' own SDKs (the openai and stripe npm packages, installed in
// e2e/node by scripts/test.sh) call their APIs through shaper's proxy,
// unchanged but for the base URL or host, with their own retries off.

// The keys of these tests: the caller's shaper key, and the upstreams'
// real secrets, which only shaper holds.
const (
	sdkShaperKey    = "shaper-key-sdk"
	openAISecret    = "sk-upstream-openai"
	stripeSecret    = "sk_test_upstream_stripe"
	chunkDelay      = 250 * time.Millisecond
	streamedChunks  = 5
	nodeScriptsDir  = "node"
	nodeModulesHint = "the e2e clients are missing: run `npm ci` in e2e/node (scripts/test.sh does)"
)

// newVendorEnv is newEnv with the fake upstream answering as the vendors'
// endpoints do (fakeupstream.Vendor): a chat completion, streamed or not,
// and a Stripe customer.
func newVendorEnv(t *testing.T, fakeCfg fakeupstream.Config) (*env, *fakeupstream.Vendor) {
	t.Helper()
	e := newEnv(t, fakeCfg, redistest.Options{})
	v := e.fake.Vendor(fakeupstream.VendorOptions{Chunks: streamedChunks, ChunkDelay: chunkDelay})
	vendorHS := httptest.NewServer(v)
	t.Cleanup(vendorHS.Close)
	e.fakeHS = vendorHS
	return e, v
}

// sdkResult is one line a script in e2e/node prints: one call's outcome.
type sdkResult struct {
	I            int               `json:"i"`
	OK           bool              `json:"ok"`
	Text         string            `json:"text"`
	ChunkMs      []int             `json:"chunk_ms"`
	TotalTokens  *int64            `json:"total_tokens"`
	Ms           int               `json:"ms"`
	QueueTime    *string           `json:"queue_time"`
	Status       int               `json:"status"`
	Error        string            `json:"error"`
	Message      string            `json:"message"`
	RetryAfter   *string           `json:"retry_after"`
	RetryAfterMs *string           `json:"retry_after_ms"`
	ID           string            `json:"id"`
	Email        string            `json:"email"`
	Name         string            `json:"name"`
	Metadata     map[string]string `json:"metadata"`
}

// runNode runs a script of e2e/node with extra environment and returns
// the calls' outcomes.
func runNode(t *testing.T, environ []string, script string, args ...string) []sdkResult {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is not installed (scripts/test.sh installs it): %v", err)
	}
	if _, err := os.Stat(filepath.Join(nodeScriptsDir, "node_modules", "openai")); err != nil {
		t.Fatal(nodeModulesHint)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, append([]string{script}, args...)...)
	cmd.Dir = nodeScriptsDir
	cmd.Env = append(os.Environ(), environ...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %s %v: %v\nstdout:\n%s\nstderr:\n%s", script, args, err, out, &stderr)
	}
	var results []sdkResult
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var r sdkResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("node %s: line %q: %v", script, line, err)
		}
		results = append(results, r)
	}
	return results
}

// openAIEnv is the environment of e2e/node/openai.mjs for a serve at base.
func openAIEnv(base string, extra ...string) []string {
	return append([]string{"SHAPER_BASE_URL=" + base + "/proxy/openai/v1", "SHAPER_KEY=" + sdkShaperKey}, extra...)
}

// sdkConfig is a config with an openai and a stripe upstream at the fake,
// both proxied, limited to rate per second (the fake limits each secret
// separately), stripe with its own listener at stripeListen unless that is
// empty (replicas on one host cannot share it).
func sdkConfig(rate int, stripeListen string) string {
	listen := ""
	if stripeListen != "" {
		listen = fmt.Sprintf(", listen: %q", stripeListen)
	}
	return fmt.Sprintf(`
redis: {url: "{{REDIS}}"}
api:
  keys: [{name: app, tenant: app, key_env: E2E_SDK_KEY}]
  admission: {capacity: 10000, refill_per_second: 10000}
upstreams:
  openai:
    base_url: "{{UPSTREAM}}"
    limits: [{rate: %[1]d, per: 1s}]
    headers: {Authorization: "Bearer %[2]s"}
    proxy: {enabled: true, max_wait: 30s}
  stripe:
    base_url: "{{UPSTREAM}}"
    limits: [{rate: %[1]d, per: 1s}]
    headers: {Authorization: "Bearer %[3]s"}
    proxy: {enabled: true, max_wait: 30s%[4]s}
`, rate, openAISecret, stripeSecret, listen)
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
			for _, val := range vals {
				if strings.Contains(val, sdkShaperKey) {
					t.Errorf("request %d reached the upstream with the caller's shaper key in %s", i, name)
				}
			}
		}
	}
}

// TestSDKsThroughTheProxy: the openai package's chat completions, plain and
// streamed, and the stripe package's customers.create (through the stripe
// upstream's own listener) each get the upstream's answer through shaper,
// the streamed one chunk by chunk as the upstream sends it.
func TestSDKsThroughTheProxy(t *testing.T) {
	if testing.Short() {
		t.Skip("shaper serve and the vendors' Node SDKs: multi-process, runs in make test")
	}
	t.Parallel()
	e, v := newVendorEnv(t, fakeupstream.Config{Rate: 100, Per: time.Second, Style: fakeupstream.StyleOpenAI})
	listen := freeAddr(t)
	e.writeConfig(sdkConfig(100, listen))
	base := e.startServe("E2E_SDK_KEY=" + sdkShaperKey)
	const want = "chunk 1 chunk 2 chunk 3 chunk 4 chunk 5"

	for _, r := range runNode(t, openAIEnv(base), "openai.mjs", "chat", "3") {
		if !r.OK || r.Text != want {
			t.Errorf("chat completion %d: %+v, want ok with %q", r.I, r, want)
		}
		if qt := r.QueueTime; qt == nil {
			t.Errorf("chat completion %d: no Shaper-Queue-Time on the answer", r.I)
		} else if s, err := strconv.ParseFloat(*qt, 64); err != nil || s < 0 {
			t.Errorf("chat completion %d: Shaper-Queue-Time %q, want seconds waited", r.I, *qt)
		}
	}

	for _, r := range runNode(t, openAIEnv(base), "openai.mjs", "stream", "2") {
		if !r.OK || r.Text != want || len(r.ChunkMs) != streamedChunks {
			t.Fatalf("streamed chat completion %d: %+v, want ok with %q in %d chunks", r.I, r, want, streamedChunks)
		}
		// The upstream spaces its chunks chunkDelay apart: relayed as they
		// come, the first and the last arrive (chunks−1)·chunkDelay apart;
		// held to the end, together. Half of that leaves room for a busy
		// host starving shaper (or node) for a while.
		spread := time.Duration(r.ChunkMs[len(r.ChunkMs)-1]-r.ChunkMs[0]) * time.Millisecond
		if min := (streamedChunks - 1) * chunkDelay / 2; spread < min {
			t.Errorf("streamed chat completion %d: chunks at %v ms, %v from first to last; want at least %v (the upstream sent them %v apart)",
				r.I, r.ChunkMs, spread, min, chunkDelay)
		}
	}

	host, port, _ := strings.Cut(listen, ":")
	for _, r := range runNode(t, []string{"SHAPER_HOST=" + host, "SHAPER_PORT=" + port, "SHAPER_KEY=" + sdkShaperKey}, "stripe.mjs", "2") {
		wantEmail := fmt.Sprintf("customer%d@example.com", r.I)
		if !r.OK || !strings.HasPrefix(r.ID, "cus_") || r.Email != wantEmail || r.Metadata["call"] != strconv.Itoa(r.I) {
			t.Errorf("customers.create %d: %+v, want ok with a cus_ id, email %s and metadata call=%d", r.I, r, wantEmail, r.I)
		}
	}

	rep := e.fake.Report()
	if rep.Keys[openAISecret].Succeeded != 5 || rep.Keys[stripeSecret].Succeeded != 2 || rep.Total != 7 {
		t.Errorf("upstream saw %v; want 5 chat completions with the openai secret and 2 customers with the stripe secret, nothing else", rep)
	}
	checkUpstreamSaw(t, v)
}

// TestSDKCallsAndJobsShareTheLimit: with the SDK's own retries off, every
// chat completion sent through two `shaper serve` replicas succeeds while
// two `shaper work` replicas drain queued jobs at the same upstream, and no
// window at the upstream holds more than its limit.
//
// A send that the host starves between its slot and the wire arrives late,
// and a late arrival can share a window with the sends after it: that is
// the host's doing, not pacing's (the fullest window in the log says which
// send it was). So the limit is held if one of three runs keeps it; every
// call and job must succeed in every run.
func TestSDKCallsAndJobsShareTheLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("shaper serve and work replicas with the Node SDK: multi-process, runs in make test")
	}
	t.Parallel()
	const runs = 3
	for run := 1; ; run++ {
		over := sdkCallsAndJobs(t)
		if over == "" || t.Failed() {
			return
		}
		if run == runs {
			t.Fatalf("every one of %d runs put more than the limit into a window at the upstream; the last:\n%s", runs, over)
		}
		t.Logf("run %d put more than the limit into a window at the upstream, trying again:\n%s", run, over)
	}
}

// sdkCallsAndJobs is one run of TestSDKCallsAndJobsShareTheLimit. It fails
// t for a call or job that did not succeed, and returns what the upstream
// saw if that broke its limit, "" if not.
func sdkCallsAndJobs(t *testing.T) string {
	const L = 10
	const jobs, calls, streamed = 40, 12, 4
	e, v := newVendorEnv(t, fakeupstream.Config{Algorithm: fakeupstream.SlidingLog, Rate: L, Per: time.Second, Style: fakeupstream.StyleOpenAI})
	defer e.stopAll()
	e.writeConfig(sdkConfig(L, ""))
	bases := []string{e.startServe("E2E_SDK_KEY=" + sdkShaperKey), e.startServe("E2E_SDK_KEY=" + sdkShaperKey)}
	ids := e.enqueue(jobs, func(i int) *queue.Job {
		return &queue.Job{Upstream: "openai", Tenant: "app", Method: "POST", Path: "/v1/jobs/" + strconv.Itoa(i)}
	})
	e.startWorker()
	e.startWorker()
	waitUntil(t, 30*time.Second, "the jobs to reach the upstream", func() bool { return e.fake.Report().Total > 0 })

	var mu sync.Mutex
	var results []sdkResult
	var wg sync.WaitGroup
	for _, base := range bases {
		for _, run := range []struct {
			mode string
			n    int
		}{{"chat", calls / len(bases)}, {"stream", streamed / len(bases)}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rs := runNode(t, openAIEnv(base), "openai.mjs", run.mode, strconv.Itoa(run.n))
				mu.Lock()
				results = append(results, rs...)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	done := e.waitDone(ids, 60*time.Second)

	if len(results) != calls+streamed {
		t.Fatalf("%d calls answered, want %d", len(results), calls+streamed)
	}
	for _, r := range results {
		if !r.OK {
			t.Errorf("call %d: %+v, want success", r.I, r)
		}
	}
	for id, info := range done {
		if info.State != queue.StateSucceeded {
			t.Errorf("job %s: %s, want succeeded", id, info.State)
		}
	}
	checkUpstreamSaw(t, v)
	rep := e.fake.Report()
	if rep.Total != jobs+calls+streamed || rep.Rejected != 0 || rep.MaxInWindow > L {
		return fmt.Sprintf("upstream saw %v; want %d requests, none refused, at most %d in any second; the fullest second:\n%s",
			rep, jobs+calls+streamed, L, fullestWindow(e.fake.Records(), time.Second))
	}
	return ""
}

// proxyCall is one raw call through the proxy and how it was answered.
type proxyCall struct {
	status       int
	retryAfter   string
	retryAfterMs string
	took         time.Duration
	body         string // the start of the answer, for failure messages
	err          error
}

// callProxy posts a chat completion to the proxy with a wait of maxWait.
func callProxy(ctx context.Context, base, maxWait string) proxyCall {
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/proxy/openai/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+sdkShaperKey)
	req.Header.Set("Content-Type", "application/json")
	if maxWait != "" {
		req.Header.Set("Shaper-Max-Wait", maxWait)
	}
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return proxyCall{err: err, took: time.Since(start)}
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return proxyCall{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"),
		retryAfterMs: resp.Header.Get("Retry-After-Ms"), took: time.Since(start), body: string(b.Bytes()[:min(b.Len(), 300)])}
}

// TestProxyWaitShorterThanItsSlotIs429: twelve calls at once at an upstream
// of one call a second, each willing to wait 3 s. Those whose slot lies
// beyond their wait are answered 429 at once, with Retry-After and
// retry-after-ms, and are never sent: the upstream receives exactly the
// calls answered 200.
func TestProxyWaitShorterThanItsSlotIs429(t *testing.T) {
	if testing.Short() {
		t.Skip("shaper serve: multi-process, runs in make test")
	}
	t.Parallel()
	e, _ := newVendorEnv(t, fakeupstream.Config{Algorithm: fakeupstream.SlidingLog, Rate: 1, Per: time.Second, Style: fakeupstream.StyleOpenAI})
	e.writeConfig(sdkConfig(1, ""))
	base := e.startServe("E2E_SDK_KEY=" + sdkShaperKey)
	const n = 12
	const wait = 3 * time.Second
	answers := make([]proxyCall, n)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = callProxy(context.Background(), base, strconv.Itoa(int(wait.Seconds())))
		}()
	}
	wg.Wait()
	var ok, refused int
	for i, a := range answers {
		switch {
		case a.err != nil:
			t.Errorf("call %d: %v", i, a.err)
		case a.status == 200:
			ok++
			if a.took > wait+2*time.Second {
				t.Errorf("call %d: answered 200 after %v, past its wait of %v", i, a.took, wait)
			}
		case a.status == 429:
			refused++
			if s, err := strconv.Atoi(a.retryAfter); err != nil || s < 1 {
				t.Errorf("call %d: 429 with Retry-After %q, want whole seconds", i, a.retryAfter)
			}
			if ms, err := strconv.Atoi(a.retryAfterMs); err != nil || ms < 1 {
				t.Errorf("call %d: 429 with retry-after-ms %q, want milliseconds", i, a.retryAfterMs)
			}
			// At once: not after waiting out the wait it could not have.
			if a.took > wait/2 {
				t.Errorf("call %d: 429 after %v; want it at once, well within its wait of %v", i, a.took, wait)
			}
		default:
			t.Errorf("call %d: status %d (%s), want 200 or 429", i, a.status, a.body)
		}
	}
	// At one a second, the slots within 3 s are those at 0, 1, 2 and 3 s.
	if ok < 2 || ok > 4 || refused != n-ok {
		t.Errorf("%d answered 200 and %d 429, want 2 to 4 of %d sent and the rest refused", ok, refused, n)
	}
	// Never sent later: after the longest wait has passed twice over, the
	// upstream has received exactly the calls answered 200.
	time.Sleep(2 * wait)
	if rep := e.fake.Report(); rep.Total != int64(ok) || rep.Rejected != 0 {
		t.Errorf("upstream saw %v; want exactly the %d calls answered 200, none refused", rep, ok)
	}
}

// TestProxyCallerWhoHangsUpIsNeverSent: at one call per 2 s, a call that
// waits behind another is shown waiting (proxy_waiting in GET
// /v1/upstreams/{name}); when it hangs up before its slot it is never
// sent, and its slot goes to the next call.
func TestProxyCallerWhoHangsUpIsNeverSent(t *testing.T) {
	if testing.Short() {
		t.Skip("shaper serve: multi-process, runs in make test")
	}
	t.Parallel()
	const every = 2 * time.Second
	e, _ := newVendorEnv(t, fakeupstream.Config{Algorithm: fakeupstream.SlidingLog, Rate: 1, Per: every, Style: fakeupstream.StyleOpenAI})
	e.writeConfig(fmt.Sprintf(`
redis: {url: "{{REDIS}}"}
api:
  keys: [{name: app, tenant: app, key_env: E2E_SDK_KEY}]
upstreams:
  openai:
    base_url: "{{UPSTREAM}}"
    limits: [{rate: 1, per: %v}]
    headers: {Authorization: "Bearer %s"}
    proxy: {enabled: true}
`, every, openAISecret))
	base := e.startServe("E2E_SDK_KEY=" + sdkShaperKey)
	waiting := func() int64 {
		req, _ := http.NewRequest("GET", base+"/v1/upstreams/openai", nil)
		req.Header.Set("Authorization", "Bearer "+sdkShaperKey)
		resp, err := e.api.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var u struct {
			ProxyWaiting *int64 `json:"proxy_waiting"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&u); err != nil || u.ProxyWaiting == nil {
			t.Fatalf("GET /v1/upstreams/openai: %d, %v; want a view with proxy_waiting", resp.StatusCode, err)
		}
		return *u.ProxyWaiting
	}

	if a := callProxy(context.Background(), base, "10"); a.status != 200 {
		t.Fatalf("first call: %+v, want 200 (%s)", a, a.body)
	}
	first := time.Now()
	ctx, hangUp := context.WithCancel(context.Background())
	defer hangUp()
	hungUp := make(chan proxyCall, 1)
	go func() { hungUp <- callProxy(ctx, base, "10") }()
	waitUntil(t, every/2, "the second call to be shown waiting", func() bool { return waiting() == 1 })
	hangUp()
	if a := <-hungUp; a.err == nil {
		t.Fatalf("the call that hung up was answered %d first; its slot is %v after the first call's", a.status, every)
	}
	// Once shaper has seen the hang-up, the caller is no longer waiting; a
	// call booked before that would rightly queue behind it.
	waitUntil(t, every/2, "shaper to see the hang-up", func() bool { return waiting() == 0 })
	next := callProxy(context.Background(), base, "10")
	if next.status != 200 {
		t.Fatalf("next call: %+v, want 200 (%s)", next, next.body)
	}
	// Its slot is the one the hung-up call gave back, one period after the
	// first call, not the one after that.
	if since := time.Since(first); since > every*7/4 {
		t.Errorf("next call answered %v after the first; want about %v, in the slot the hung-up call freed (%v if it was not freed)", since, every, 2*every)
	}
	time.Sleep(2 * every)
	if rep := e.fake.Report(); rep.Total != 2 || rep.Rejected != 0 {
		t.Errorf("upstream saw %v; want the 2 calls answered, never the one that hung up", rep)
	}
}

// TestDevProxyCurlWorksAsPrinted: `shaper dev` prints a curl line for the
// proxy, and it works as printed: the demo upstream's own answer comes
// back.
func TestDevProxyCurlWorksAsPrinted(t *testing.T) {
	if testing.Short() {
		t.Skip("runs shaper dev: multi-process, runs in make test")
	}
	t.Parallel()
	addr := freeAddr(t)
	cmd := exec.Command(shaperBin, "dev", "--listen", addr, "--log-level", "warn")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	}()
	sc := bufio.NewScanner(stdout)
	curl := ""
	for curl == "" && sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); strings.HasPrefix(line, "curl ") && strings.Contains(line, "/proxy/demo/") {
			curl = line
		}
	}
	go io.Copy(io.Discard, stdout)
	if curl == "" {
		t.Fatalf("the banner has no curl line for the proxy; stderr:\n%s", stderr.String())
	}
	out, err := exec.Command("sh", "-c", curl).CombinedOutput()
	if err != nil {
		t.Fatalf("the printed curl line failed: %v\n%s", err, out)
	}
	// The demo upstream echoes the request it received.
	var echo struct{ Object, Method, Path string }
	if err := json.Unmarshal(out, &echo); err != nil || echo.Object != "echo" || echo.Method != "POST" || !strings.HasPrefix(echo.Path, "/v1/") {
		t.Fatalf("curl printed %s, want the demo upstream's echo of a POST under /v1/", out)
	}
}

// fullestWindow lists the arrivals in the window of length per that holds
// the most, to say whose they were (calls or jobs) when there are too many.
func fullestWindow(recs []fakeupstream.Record, per time.Duration) string {
	best, bestLo, lo := 0, 0, 0
	for hi := range recs {
		for recs[lo].At <= recs[hi].At-per {
			lo++
		}
		if hi-lo+1 > best {
			best, bestLo = hi-lo+1, lo
		}
	}
	var b strings.Builder
	for _, r := range recs[bestLo : bestLo+best] {
		fmt.Fprintf(&b, "  %v %s %s -> %d\n", r.At.Round(time.Millisecond), r.Method, r.Path, r.Status)
	}
	return b.String()
}

// TestProxyCallsGetTheirTenantsFairShare: tenant a's 1,000 queued jobs
// drain at the upstream's limit; tenant b's calls, one after another, each
// wait about one slot for b's fair share, not behind a's backlog, and all
// succeed within a short wait.
func TestProxyCallsGetTheirTenantsFairShare(t *testing.T) {
	if testing.Short() {
		t.Skip("shaper serve and work: multi-process, runs in make test")
	}
	t.Parallel()
	const L = 20
	e, _ := newVendorEnv(t, fakeupstream.Config{Algorithm: fakeupstream.SlidingLog, Rate: L, Per: time.Second, Style: fakeupstream.StyleOpenAI})
	e.writeConfig(fmt.Sprintf(`
redis: {url: "{{REDIS}}"}
api:
  keys: [{name: b, tenant: b, key_env: E2E_SDK_KEY}]
upstreams:
  openai:
    base_url: "{{UPSTREAM}}"
    limits: [{rate: %d, per: 1s}]
    headers: {Authorization: "Bearer %s"}
    proxy: {enabled: true}
`, L, openAISecret))
	base := e.startServe("E2E_SDK_KEY=" + sdkShaperKey)
	e.enqueue(1000, func(i int) *queue.Job {
		return &queue.Job{Upstream: "openai", Tenant: "a", Method: "POST", Path: "/v1/jobs/" + strconv.Itoa(i)}
	})
	e.startWorker()
	waitUntil(t, 30*time.Second, "tenant a's jobs to reach the upstream", func() bool { return e.fake.Report().Total > L })

	// The backlog is 50 s deep: a call queued behind it would be refused
	// at once for its 3 s wait.
	const calls = 10
	var waits []time.Duration
	for i := range calls {
		a := callProxy(context.Background(), base, "3")
		if a.status != 200 {
			t.Fatalf("call %d: %d (%s), want 200 within its fair share", i, a.status, a.body)
		}
		waits = append(waits, a.took)
	}
	// Two tenants share 20 slots a second, so b's next slot is at most a
	// few tenths of a second off; half a second is the worst each may take.
	slices.Sort(waits)
	if median := waits[calls/2]; median > 500*time.Millisecond {
		t.Errorf("tenant b's calls took %v (sorted); want each about one of b's slots, a median under 500ms", waits)
	}
	// The limit itself is TestSDKCallsAndJobsShareTheLimit's to hold,
	// with its allowance for a busy host's late sends; here it is only told.
	if rep := e.fake.Report(); rep.Rejected != 0 {
		t.Logf("upstream saw %v; the fullest second:\n%s", rep, fullestWindow(e.fake.Records(), time.Second))
	}
}
