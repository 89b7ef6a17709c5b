package server

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/leaky"
)

// tokensUpstream is an upstream limited to 1,000 tokens per 10 s (all at
// once, then 1 per 10 s), each call's tokens estimated from its max_tokens and settled from
// the answer's usage.total_tokens.
func tokensUpstream(u *shaper.Upstream) {
	u.Limits = []leaky.Limit{leaky.PerSecond(1000), {Rate: 1000, Per: 10 * time.Second, Cost: "tokens", Burst: 1000}}
	u.Proxy.Cost = map[string]shaper.Settle{"tokens": {JSON: "/max_tokens"}}
	u.Settle = map[string]shaper.Settle{"tokens": {JSON: "/usage/total_tokens"}}
	// A wide guard (the most it may be): on a loaded machine a first
	// call's booking (its script loaded first) can come back after the
	// default guard allows, and a late slot is spent, its tokens with it,
	// which would leave these tests' second call no room.
	u.Guard = 100 * time.Millisecond
}

// openAIStream is a streamed chat completion as OpenAI sends it with
// stream_options.include_usage: chunks saying "usage": null, a last one
// with the usage, then [DONE]; eol ends each line.
func openAIStream(eol string, total int) string {
	var b strings.Builder
	for i := range 3 {
		fmt.Fprintf(&b, `data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"w%d"}}],"usage":null}`+eol+eol, i)
	}
	if total >= 0 {
		fmt.Fprintf(&b, `data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":%d,"total_tokens":%d}}`+eol+eol, total-10, total)
	}
	b.WriteString("data: [DONE]" + eol + eol)
	return b.String()
}

// TestProxySettlesStreamedAnswer: a streamed answer (server-sent events)
// is relayed unchanged and settles the call's estimate from the last event
// that carries the settle path, whatever the line ends and however the
// upstream splits its writes; without such an event the estimate stands.
func TestProxySettlesStreamedAnswer(t *testing.T) {
	for _, c := range []struct {
		name   string
		stream string
		split  int // bytes per write and flush; 0: one write
		freed  bool
	}{
		{"usage in the last chunk", openAIStream("\n", 100), 0, true},
		{"CRLF, a byte at a time", openAIStream("\r\n", 100), 1, true},
		{"CR, in 7-byte writes", openAIStream("\r", 100), 7, true},
		{"the last of two counts", `data: {"usage":{"total_tokens":950}}` + "\n\n" + openAIStream("\n", 100), 0, true},
		{"a later event overrides", openAIStream("\n", 100) + `data: {"usage":{"total_tokens":950}}` + "\n\n", 0, false},
		{"data over two lines", "event: x\n: a comment\ndata: {\"usage\":\ndata: {\"total_tokens\": 100}}\n\n", 0, true},
		{"no usage: the estimate stands", openAIStream("\n", -1), 0, false},
		{"an event over the cap is skipped", "data: {\"pad\":\"" + strings.Repeat("x", proxySettleMaxBytes) + "\",\"usage\":{\"total_tokens\":100}}\n\n", 4096, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			// A Redis of its own: the case before settles as its stream
			// ends, which may land after this case has flushed a shared
			// one, and charge this case's first call.
			f := newProxyFixtureOn(t, redistest.New(t).Client(t), &recorder{}, tokensUpstream)
			f.up.answer = func(w http.ResponseWriter, r *http.Request, n int) {
				w.Header().Set("Content-Type", "text/event-stream")
				rc := http.NewResponseController(w)
				rest := c.stream
				for len(rest) > 0 {
					k := len(rest)
					if c.split > 0 {
						k = min(k, c.split)
					}
					io.WriteString(w, rest[:k])
					rc.Flush()
					rest = rest[k:]
				}
			}
			resp, body := f.call("POST", "/proxy/api/v1/chat/completions", `{"max_tokens": 900, "stream": true}`)
			if resp.StatusCode != 200 || body != c.stream {
				t.Fatalf("got %d, %d bytes, want 200 and the stream unchanged (%d bytes)", resp.StatusCode, len(body), len(c.stream))
			}
			// Settled to 100, 900 are free again, where the estimate
			// left 100.
			resp, body = f.call("POST", "/proxy/api/v1/chat/completions", `{"max_tokens": 800}`, "Shaper-Max-Wait", "0")
			if freed := resp.StatusCode == 200; freed != c.freed {
				t.Errorf("800 tokens after the stream: got %d %s, want 200: %v", resp.StatusCode, body, c.freed)
			}
		})
	}
}

// TestProxySettlesGzippedAnswer: a small JSON answer the upstream
// gzipped (the caller asked for it) is relayed as it came and settles
// from its decompressed body.
func TestProxySettlesGzippedAnswer(t *testing.T) {
	f := newProxyFixtureOn(t, redistest.New(t).Client(t), &recorder{}, tokensUpstream) // see TestProxySettlesStreamedAnswer
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	zw.Write([]byte(`{"usage": {"total_tokens": 100}}`))
	zw.Close()
	f.up.answer = func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Content-Length", fmt.Sprint(zipped.Len()))
		w.Write(zipped.Bytes())
	}
	req, _ := http.NewRequest("POST", f.hs.URL+"/proxy/api/v1/chat", strings.NewReader(`{"max_tokens": 900}`))
	req.Header.Set("Authorization", "Bearer billing-secret")
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Encoding") != "gzip" || !bytes.Equal(got, zipped.Bytes()) {
		t.Fatalf("got %d %q, %d bytes; want 200 and the gzipped body as sent", resp.StatusCode, resp.Header.Get("Content-Encoding"), len(got))
	}
	if resp, body := f.call("POST", "/proxy/api/v1/chat", `{"max_tokens": 800}`, "Shaper-Max-Wait", "0"); resp.StatusCode != 200 {
		t.Errorf("800 after settling: got %d %s, want 200", resp.StatusCode, body)
	}
}

// TestProxyLetsTheBodyGo: a call's request body is kept while a retry may
// need it, not while its answer streams.
func TestProxyLetsTheBodyGo(t *testing.T) {
	const size = 24 << 20
	rdb := srv.Client(t)
	rdb.FlushAll(context.Background())
	release := make(chan struct{})
	got := make(chan int64, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		got <- n
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: first\n\n")
		http.NewResponseController(w).Flush()
		<-release
		io.WriteString(w, "data: last\n\n")
	}))
	defer up.Close()
	defer close(release)
	f := newProxyFixtureOn(t, rdb, &recorder{}, func(u *shaper.Upstream) { u.BaseURL = up.URL },
		func(c *Config) { c.MaxBodyBytes = 32 << 20 })
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	req, _ := http.NewRequest("POST", f.hs.URL+"/proxy/api/v1/upload", io.LimitReader(zeros{}, size))
	req.ContentLength = size
	req.Header.Set("Authorization", "Bearer billing-secret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make([]byte, len("data: first\n\n"))
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "data: first\n\n" {
		t.Fatalf("got %q (%v), want the first event", first, err)
	}
	if n := <-got; n != size {
		t.Fatalf("upstream got %d bytes, want %d", n, size)
	}
	during := heap()
	t.Logf("heap %d MiB before the call, %d MiB while its answer streams (body %d MiB)", before>>20, during>>20, size>>20)
	if during > before+size/3 {
		t.Errorf("heap grew by %d MiB while the answer streamed, want the %d MiB body let go", (during-before)>>20, size>>20)
	}
}

// zeros reads as endless zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TestProxyBodyOverTheCap: a body over max_body_bytes, with or without a
// Content-Length, is answered 413 problem+json and nothing is sent.
func TestProxyBodyOverTheCap(t *testing.T) {
	f := newProxyFixture(t, nil)
	for _, chunked := range []bool{false, true} {
		var body io.Reader = strings.NewReader(strings.Repeat("x", 5000))
		if chunked {
			// No Content-Length: the cap is found while reading.
			body = io.LimitReader(zeros{}, 5000)
		}
		req, _ := http.NewRequest("POST", f.hs.URL+"/proxy/api/v1/x", body)
		req.Header.Set("Authorization", "Bearer billing-secret")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var p map[string]any
		if resp.StatusCode != 413 || resp.Header.Get("Content-Type") != "application/problem+json" || json.Unmarshal(b, &p) != nil || p["status"] != 413.0 {
			t.Errorf("chunked %v: got %d %q %s, want 413 problem+json", chunked, resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
	}
	if n := len(f.up.requests()); n != 0 {
		t.Errorf("upstream got %d requests, want none", n)
	}
}

// TestProxySettlesJSONOfUnknownLength: a JSON answer without a
// Content-Length settles when it ends within the 64 KiB read for it; a
// longer one is relayed whole and its estimate stands.
func TestProxySettlesJSONOfUnknownLength(t *testing.T) {
	for _, c := range []struct {
		name  string
		pad   int
		freed bool
	}{
		{"small", 10, true},
		{"over the cap", proxySettleMaxBytes, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newProxyFixtureOn(t, redistest.New(t).Client(t), &recorder{}, tokensUpstream) // see TestProxySettlesStreamedAnswer
			answer := `{"usage": {"total_tokens": 100}, "pad": "` + strings.Repeat("x", c.pad) + `"}`
			f.up.answer = func(w http.ResponseWriter, r *http.Request, n int) {
				w.Header().Set("Content-Type", "application/json")
				rc := http.NewResponseController(w)
				// Flushed in parts: chunked, no Content-Length.
				for _, part := range strings.SplitAfter(answer, ",") {
					io.WriteString(w, part)
					rc.Flush()
				}
			}
			resp, body := f.call("POST", "/proxy/api/v1/chat", `{"max_tokens": 900}`)
			if resp.StatusCode != 200 || body != answer {
				t.Fatalf("got %d, %d bytes; want 200 and the %d bytes sent", resp.StatusCode, len(body), len(answer))
			}
			resp, body = f.call("POST", "/proxy/api/v1/chat", `{"max_tokens": 800}`, "Shaper-Max-Wait", "0")
			if freed := resp.StatusCode == 200; freed != c.freed {
				t.Errorf("800 after the answer: got %d %s, want 200: %v", resp.StatusCode, body, c.freed)
			}
		})
	}
}

// TestHeldBody: released, the body goes once no reader is part way
// through it; a reader that never started holds nothing, one part way
// reads to the end first.
func TestHeldBody(t *testing.T) {
	h := holdBody([]byte("0123456789"))
	unused, _ := h.open()
	part, get := h.open()
	buf := make([]byte, 4)
	if n, err := part.Read(buf); n != 4 || err != nil {
		t.Fatalf("read %d, %v; want 4 bytes", n, err)
	}
	h.release()
	if h.b == nil {
		t.Fatalf("the body went while a reader was part way through it")
	}
	rest, err := io.ReadAll(part)
	if err != nil || string(rest) != "456789" {
		t.Fatalf("the rest: %q, %v; want 456789", rest, err)
	}
	if h.b != nil {
		t.Errorf("the body stayed after its last reader ended")
	}
	if _, err := unused.Read(buf); err != errBodyReleased {
		t.Errorf("a reader started after release: %v, want errBodyReleased", err)
	}
	again, _ := get()
	if _, err := again.Read(buf); err != errBodyReleased {
		t.Errorf("GetBody after release: %v, want errBodyReleased", err)
	}

	// Not released, a body is read again in full (a retry).
	h = holdBody([]byte("abc"))
	for range 2 {
		r, _ := h.open()
		if b, err := io.ReadAll(r); err != nil || string(b) != "abc" {
			t.Fatalf("got %q, %v; want abc", b, err)
		}
		r.Close()
	}
}
