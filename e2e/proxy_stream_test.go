package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

// bigAnswerBytes is the size of the answers TestProxyRelaysBigAnswersFlat
// relays; flatMemoryBytes is how far above its idle peak the serve
// process's resident memory may go while it does.
const (
	bigAnswerBytes  = 100 << 20
	flatMemoryBytes = 32 << 20
)

// bigUpstream answers GET /v1/big.json with bigAnswerBytes of JSON (with a
// Content-Length), and POST /v1/chat/completions with bigAnswerBytes of
// server-sent events in OpenAI's shape, the usage (total_tokens 100) in
// the last chunk before [DONE].
func bigUpstream() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/v1/big.json":
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", strconv.Itoa(bigAnswerBytes))
			writeBigJSON(w)
		case "/v1/chat/completions":
			w.Header().Set("Content-Type", "text/event-stream")
			writeBigStream(w)
		default:
			http.NotFound(w, r)
		}
	})
}

// writeBigJSON writes {"pad":"xxx…"} of exactly bigAnswerBytes.
func writeBigJSON(w io.Writer) {
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	io.WriteString(w, `{"pad":"`)
	left := bigAnswerBytes - len(`{"pad":"`) - len(`"}`)
	for left > 0 {
		n := min(left, len(chunk))
		if _, err := w.Write(chunk[:n]); err != nil {
			return
		}
		left -= n
	}
	io.WriteString(w, `"}`)
}

// writeBigStream writes chunks of about 4 KiB each until bigAnswerBytes
// are sent, then the usage and [DONE].
func writeBigStream(w io.Writer) {
	event := []byte(`data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"` +
		strings.Repeat("y", 4000) + `"}}],"usage":null}` + "\n\n")
	bw := bufio.NewWriterSize(w, 64<<10)
	for sent := 0; sent < bigAnswerBytes; sent += len(event) {
		if _, err := bw.Write(event); err != nil {
			return
		}
	}
	io.WriteString(bw, `data: {"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":90,"total_tokens":100}}`+"\n\n")
	io.WriteString(bw, "data: [DONE]\n\n")
	bw.Flush()
}

// peakRSS is the process's resident-set high-water mark (VmHWM).
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("reading the serve process's memory: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("/proc/%d/status has no VmHWM", pid)
	return 0
}

// TestProxyRelaysBigAnswersFlat: one `shaper serve` relays a 100 MB JSON
// answer and a 100 MB streamed chat completion, whose cost it settles from
// the last event, with its peak resident memory staying within 32 MB of
// what it was idle; the caller gets every byte as sent.
func TestProxyRelaysBigAnswersFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("relays 200 MB through a shaper serve process: runs in make test")
	}
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("needs /proc to read the serve process's memory")
	}
	e := newEnv(t, fakeupstream.Config{}, redistest.Options{})
	up := httptest.NewServer(bigUpstream())
	t.Cleanup(up.Close)
	e.fakeHS = up
	e.writeConfig(`
redis: {url: "{{REDIS}}"}
api:
  keys: [{name: app, key_env: E2E_KEY}]
upstreams:
  big:
    base_url: "{{UPSTREAM}}"
    limits:
      - {rate: 100, per: 1s}
      - {rate: 1000, per: 10s, cost: tokens, burst: 1000}
    proxy: {enabled: true, max_wait: 10s, cost: {tokens: {json: /max_tokens}}}
    settle: {tokens: {json: /usage/total_tokens}}
`)
	addr := freeAddr(t)
	serve := e.startProc([]string{"E2E_KEY=k-e2e"}, "serve", "--config", e.cfg, "--listen", addr, "--log-level", "warn")
	base := "http://" + addr
	waitUntil(t, 30*time.Second, "shaper serve to be ready", func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	pid := serve.cmd.Process.Pid
	hc := &http.Client{Timeout: 2 * time.Minute}
	call := func(method, path, body string, hdr ...string) (*http.Response, int64, uint32) {
		t.Helper()
		req, _ := http.NewRequest(method, base+"/proxy/big"+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer k-e2e")
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		sum := crc32.NewIEEE()
		n, err := io.Copy(sum, resp.Body)
		if err != nil {
			t.Fatalf("%s %s: reading the answer: %v after %d bytes", method, path, err, n)
		}
		return resp, n, sum.Sum32()
	}
	want := func(write func(io.Writer)) (int64, uint32) {
		sum := crc32.NewIEEE()
		cw := &countingWriter{w: sum}
		write(cw)
		return cw.n, sum.Sum32()
	}

	// Idle, after one small call has set up what every call uses.
	if resp, _, _ := call("GET", "/v1/none", ""); resp.StatusCode != 404 {
		t.Fatalf("warm-up call: got %d, want the upstream's 404", resp.StatusCode)
	}
	idle := peakRSS(t, pid)

	start := time.Now()
	resp, n, sum := call("GET", "/v1/big.json", "")
	jsonTook := time.Since(start)
	wantN, wantSum := want(writeBigJSON)
	if resp.StatusCode != 200 || n != wantN || sum != wantSum {
		t.Fatalf("JSON: got %d, %d bytes (crc %x), want 200 and the %d bytes sent (crc %x)", resp.StatusCode, n, sum, wantN, wantSum)
	}
	afterJSON := peakRSS(t, pid)

	start = time.Now()
	resp, n, sum = call("POST", "/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":900}`)
	streamTook := time.Since(start)
	wantN, wantSum = want(writeBigStream)
	if resp.StatusCode != 200 || n != wantN || sum != wantSum {
		t.Fatalf("stream: got %d, %d bytes (crc %x), want 200 and the %d bytes sent (crc %x)", resp.StatusCode, n, sum, wantN, wantSum)
	}
	afterStream := peakRSS(t, pid)

	t.Logf("serve's peak RSS: %.1f MiB idle, %.1f MiB after relaying %d MiB of JSON (%v), %.1f MiB after %d MiB of events (%v)",
		mib(idle), mib(afterJSON), bigAnswerBytes>>20, jsonTook.Round(time.Millisecond), mib(afterStream), bigAnswerBytes>>20, streamTook.Round(time.Millisecond))
	if afterStream-idle > flatMemoryBytes {
		t.Errorf("serve's peak RSS grew by %.1f MiB relaying %d MiB answers, want at most %d MiB", mib(afterStream-idle), bigAnswerBytes>>20, flatMemoryBytes>>20)
	}
	// The stream's last event settled its 900 estimated tokens to 100:
	// 800 more go at once, where the estimate left 100.
	if resp, _, _ := call("POST", "/v1/none", `{"max_tokens":800}`, "Shaper-Max-Wait", "0"); resp.StatusCode != 404 {
		t.Errorf("800 tokens after the settled stream: got %d, want the upstream's 404 (sent at once)", resp.StatusCode)
	}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.w.Write(p)
}

// TestSDKStreamSettles: the openai package streams chat completions with
// stream_options.include_usage through the proxy, one after another, each
// estimated at max_tokens 900 of a limit of 1,000 tokens per 10 s with no
// wait allowed: each gets its usage chunk as sent, and each is settled
// from it (5 tokens), so the next goes at once, where the estimate alone
// would refuse it.
func TestSDKStreamSettles(t *testing.T) {
	if testing.Short() {
		t.Skip("shaper serve and the openai Node SDK: multi-process, runs in make test")
	}
	t.Parallel()
	e, _ := newVendorEnv(t, fakeupstream.Config{Style: fakeupstream.StyleOpenAI})
	e.writeConfig(fmt.Sprintf(`
redis: {url: "{{REDIS}}"}
api:
  keys: [{name: app, tenant: app, key_env: E2E_SDK_KEY}]
upstreams:
  openai:
    base_url: "{{UPSTREAM}}"
    limits:
      - {rate: 100, per: 1s}
      - {rate: 1000, per: 10s, cost: tokens, burst: 1000}
    headers: {Authorization: "Bearer %s"}
    proxy: {enabled: true, cost: {tokens: {json: /max_tokens}}}
    settle: {tokens: {json: /usage/total_tokens}}
`, openAISecret))
	base := e.startServe("E2E_SDK_KEY=" + sdkShaperKey)
	const want = "chunk 1 chunk 2 chunk 3 chunk 4 chunk 5"
	results := runNode(t, openAIEnv(base, "SHAPER_MAX_TOKENS=900", "SHAPER_MAX_WAIT=0"), "openai.mjs", "stream-usage", "3")
	if len(results) != 3 {
		t.Fatalf("got %d results, want 3", len(results))
	}
	for _, r := range results {
		if !r.OK || r.Text != want || r.TotalTokens == nil || *r.TotalTokens != streamedChunks {
			t.Errorf("streamed chat completion %d: %+v (total_tokens %v), want ok with %q and the usage chunk's total_tokens %d", r.I, r, r.TotalTokens, want, streamedChunks)
		}
	}
	if rep := e.fake.Report(); rep.Keys[openAISecret].Succeeded != 3 {
		t.Errorf("upstream saw %v, want 3 chat completions", rep)
	}
}
