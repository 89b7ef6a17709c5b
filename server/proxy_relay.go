package server

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/shaperhq/shaper"
)

// The answer to a call goes to its caller as it comes: status, headers,
// then the body, read and written 32 KiB at a time and flushed after each
// read, so that memory stays flat whatever the answer's size and
// server-sent events arrive as they are sent. Settling a cost from the
// body keeps at most proxySettleMaxBytes of it: a small JSON answer read
// whole first, or the event being read of a streamed one.

// relayBufBytes is how much of an answer is read, then written and
// flushed, at a time.
const relayBufBytes = 32 << 10

// settleEvery is how often, at most, a streamed answer whose events keep
// changing the amount settles before its end: each settle is a Redis
// call, and an upstream may repeat a running total in every event.
const settleEvery = time.Second

// relay streams the upstream's answer to the caller. The call's request
// body is let go first: no retry can need it once its answer is relayed.
func (s *Server) relay(w http.ResponseWriter, e *proxyEntry, c callSpec, resp *http.Response) {
	defer resp.Body.Close()
	c.held.release()
	st := s.newCallSettle(e, c)
	var whole []byte
	var watch *sseWatch
	if st != nil {
		st.fromHeaders(resp.Header)
		switch {
		case !st.fromBody:
		case resp.ContentLength >= 0 && resp.ContentLength <= proxySettleMaxBytes && isJSON(resp.Header):
			b, err := io.ReadAll(io.LimitReader(resp.Body, proxySettleMaxBytes+1))
			if err == nil {
				whole = b
				st.fromJSON(resp.Header, b)
			}
		case isEventStream(resp.Header) && resp.Header.Get("Content-Encoding") == "":
			watch = newSSEWatch(st.jsonRules())
		}
		st.flush(true)
	}
	h := w.Header()
	drop := hopHeaders(resp.Header)
	for k, vs := range resp.Header {
		if !drop[http.CanonicalHeaderKey(k)] {
			h[k] = vs
		}
	}
	w.WriteHeader(resp.StatusCode)
	if whole != nil {
		w.Write(whole)
		return
	}
	rc := http.NewResponseController(w)
	buf := make([]byte, relayBufBytes)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if watch != nil {
				// What an event says is settled before the caller reads
				// it: a caller that has the usage finds the limit
				// already charged with it.
				watch.Write(buf[:n])
				st.fromEvents(watch)
				st.flush(false)
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				break
			}
			rc.Flush()
		}
		if err != nil {
			break
		}
	}
	if watch != nil {
		st.flush(true)
	}
}

func isJSON(h http.Header) bool {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

func isEventStream(h http.Header) bool {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	return err == nil && mt == "text/event-stream"
}

// callSettle replaces a call's estimated costs by what its answer says it
// used, as for a job (settle), keeping what each cost stands at now so
// that a later, truer amount (a streamed answer's last event) settles
// only the difference.
type callSettle struct {
	s        *Server
	e        *proxyEntry
	c        callSpec
	fromBody bool
	charged  map[string]int64 // what the limits hold for each cost now
	want     map[string]int64 // the answer's amounts not yet settled
	last     time.Time        // when a streamed answer last settled
}

// newCallSettle is nil when the upstream settles nothing.
func (s *Server) newCallSettle(e *proxyEntry, c callSpec) *callSettle {
	if len(e.up.Settle) == 0 {
		return nil
	}
	st := &callSettle{s: s, e: e, c: c, charged: map[string]int64{}, want: map[string]int64{}}
	for cost, rule := range e.up.Settle {
		st.charged[cost] = c.costs[cost]
		st.fromBody = st.fromBody || rule.JSON != ""
	}
	return st
}

func (st *callSettle) fromHeaders(h http.Header) {
	for cost, rule := range st.e.up.Settle {
		if rule.Header == "" {
			continue
		}
		if n, ok := rule.Amount(h, nil); ok {
			st.want[cost] = n
		}
	}
}

// fromJSON reads a whole JSON answer, gunzipped if the upstream
// compressed it (at most proxySettleMaxBytes of it).
func (st *callSettle) fromJSON(h http.Header, body []byte) {
	switch strings.ToLower(strings.TrimSpace(h.Get("Content-Encoding"))) {
	case "", "identity":
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			return
		}
		plain, err := io.ReadAll(io.LimitReader(zr, proxySettleMaxBytes+1))
		if err != nil || len(plain) > proxySettleMaxBytes {
			return
		}
		body = plain
	default:
		return
	}
	for cost, rule := range st.e.up.Settle {
		if rule.JSON == "" {
			continue
		}
		if n, ok := rule.Amount(h, body); ok {
			st.want[cost] = n
		}
	}
}

func (st *callSettle) jsonRules() map[string]shaper.Settle {
	out := map[string]shaper.Settle{}
	for cost, rule := range st.e.up.Settle {
		if rule.JSON != "" {
			out[cost] = rule
		}
	}
	return out
}

// fromEvents takes the amounts the stream's events gave since last asked.
func (st *callSettle) fromEvents(w *sseWatch) {
	for cost, n := range w.found {
		st.want[cost] = n
		delete(w.found, cost)
	}
}

// flush settles the amounts read but not yet settled: always when final,
// else (mid-stream) at most every settleEvery.
func (st *callSettle) flush(final bool) {
	if len(st.want) == 0 || !final && !st.last.IsZero() && time.Since(st.last) < settleEvery {
		return
	}
	st.last = time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	limits := st.e.up.PartitionLimitsFor(st.c.partition)
	for cost, n := range st.want {
		delete(st.want, cost)
		if n == st.charged[cost] {
			continue
		}
		if err := st.e.bucket.Settle(ctx, cost, st.charged[cost], n, st.c.partition, limits); err != nil {
			st.s.m.RedisErrors.WithLabelValues("pacing").Inc()
			continue
		}
		st.charged[cost] = n
	}
}

// sseWatch reads server-sent events (the WHATWG HTML standard's
// text/event-stream) as they pass, keeping only the line and the data of
// the event being read, each capped at proxySettleMaxBytes (a longer
// event is skipped), and notes the amount of each rule in every event
// whose data, as JSON, has it: the last one counts.
type sseWatch struct {
	rules map[string]shaper.Settle
	// keys are the quoted last tokens of the rules' pointers: an event
	// without its rule's key is not decoded.
	keys     map[string][]byte
	line     []byte
	data     []byte
	hasData  bool
	lineOver bool // the line being read outgrew the cap
	over     bool // the event being read is skipped
	lastCR   bool // the last byte was a CR: a LF right after it ends nothing
	found    map[string]int64
}

func newSSEWatch(rules map[string]shaper.Settle) *sseWatch {
	w := &sseWatch{rules: rules, keys: map[string][]byte{}, found: map[string]int64{}}
	for cost, rule := range rules {
		i := strings.LastIndexByte(rule.JSON, '/')
		tok := strings.ReplaceAll(strings.ReplaceAll(rule.JSON[i+1:], "~1", "/"), "~0", "~")
		// A key that JSON may spell with escapes is looked for by
		// decoding every event.
		if tok != "" && !strings.ContainsAny(tok, "\"\\/") && isPrintableASCII(tok) {
			w.keys[cost] = []byte(`"` + tok + `"`)
		}
	}
	return w
}

func isPrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// Write takes the next bytes of the stream; it never fails.
func (w *sseWatch) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if w.lastCR {
			w.lastCR = false
			if p[0] == '\n' {
				p = p[1:]
				continue
			}
		}
		i := bytes.IndexAny(p, "\r\n")
		if i < 0 {
			w.grow(p)
			break
		}
		w.grow(p[:i])
		w.lastCR = p[i] == '\r'
		p = p[i+1:]
		w.endLine()
	}
	return n, nil
}

func (w *sseWatch) grow(p []byte) {
	if w.lineOver {
		return
	}
	if len(w.line)+len(p) > proxySettleMaxBytes {
		w.lineOver, w.line = true, w.line[:0]
		return
	}
	w.line = append(w.line, p...)
}

// endLine acts on a whole line: a field, or the blank line that ends an
// event. A line over the cap skips its event.
func (w *sseWatch) endLine() {
	line := w.line
	w.line = w.line[:0]
	switch {
	case w.lineOver:
		w.lineOver, w.over = false, true
		return
	case len(line) == 0:
		w.dispatch()
		return
	case w.over:
		return
	}
	field, value, _ := bytes.Cut(line, []byte(":"))
	if string(field) != "data" {
		return
	}
	value = bytes.TrimPrefix(value, []byte(" "))
	if len(w.data)+len(value)+1 > proxySettleMaxBytes {
		w.over = true
		return
	}
	if w.hasData {
		w.data = append(w.data, '\n')
	}
	w.data = append(w.data, value...)
	w.hasData = true
}

// dispatch ends an event: its data, when it is JSON with a rule's
// amount, sets that rule's amount.
func (w *sseWatch) dispatch() {
	data, skip := w.data, w.over
	w.data, w.hasData, w.over = w.data[:0], false, false
	if skip || len(data) == 0 || data[0] != '{' && data[0] != '[' {
		return
	}
	for cost, rule := range w.rules {
		if key, ok := w.keys[cost]; ok && !bytes.Contains(data, key) {
			continue
		}
		if n, ok := rule.Amount(nil, data); ok {
			w.found[cost] = n
		}
	}
}

// heldBody is a call's request body, kept while a retry may send it
// again: the transport reads it through readers from open, and once the
// answer is relayed (release) the bytes go as soon as no reader is open.
type heldBody struct {
	mu       sync.Mutex
	b        []byte
	readers  int
	released bool
}

var errBodyReleased = errors.New("proxy: the call's body was already let go")

func holdBody(b []byte) *heldBody { return &heldBody{b: b} }

// open returns a reader over the body and a GetBody that opens another
// (the transport's own retry of a request it could not send).
func (h *heldBody) open() (io.ReadCloser, func() (io.ReadCloser, error)) {
	get := func() (io.ReadCloser, error) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.released {
			return nil, errBodyReleased
		}
		h.readers++
		return &heldReader{h: h}, nil
	}
	h.mu.Lock()
	h.readers++
	h.mu.Unlock()
	return &heldReader{h: h}, get
}

// release lets the body go once no reader is open.
func (h *heldBody) release() {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.released = true
	if h.readers == 0 {
		h.b = nil
	}
}

type heldReader struct {
	h      *heldBody
	off    int
	closed bool
}

func (r *heldReader) Read(p []byte) (int, error) {
	h := r.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if r.closed {
		return 0, errBodyReleased
	}
	if r.off >= len(h.b) {
		return 0, io.EOF
	}
	n := copy(p, h.b[r.off:])
	r.off += n
	return n, nil
}

func (r *heldReader) Close() error {
	h := r.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if !r.closed {
		r.closed = true
		h.readers--
		if h.released && h.readers == 0 {
			h.b = nil
		}
	}
	return nil
}
