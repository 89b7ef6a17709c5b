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
	var whole, head []byte
	var watch *shaper.EventSettler
	if st != nil {
		st.fromHeaders(resp.Header)
		switch {
		case !st.fromBody:
		case resp.ContentLength <= proxySettleMaxBytes && isJSON(resp.Header):
			// Of unknown length (chunked, or gunzipped by the
			// transport), as much as the cap is read: a longer answer
			// is relayed on from there, unsettled.
			b, err := io.ReadAll(io.LimitReader(resp.Body, proxySettleMaxBytes+1))
			if err == nil && len(b) <= proxySettleMaxBytes {
				whole = b
				st.fromJSON(resp.Header, b)
			} else {
				head = b
			}
		case isEventStream(resp.Header) && resp.Header.Get("Content-Encoding") == "":
			watch = shaper.NewEventSettler(st.jsonRules())
		}
		st.flush(true)
	}
	h := w.Header()
	drop := hopHeaders(resp.Header)
	for k, vs := range resp.Header {
		if !drop.has(http.CanonicalHeaderKey(k)) {
			h[k] = vs
		}
	}
	w.WriteHeader(resp.StatusCode)
	if whole != nil {
		w.Write(whole)
		return
	}
	rc := http.NewResponseController(w)
	if len(head) > 0 {
		if _, err := w.Write(head); err != nil {
			return
		}
	}
	// A buffer kept between calls, not allocated (and zeroed) for each.
	bp := e.bufs.Get().(*[]byte)
	defer e.bufs.Put(bp)
	buf := *bp
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

func isEventStream(h http.Header) bool { return shaper.IsEventStream(h) }

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
func (st *callSettle) fromEvents(w *shaper.EventSettler) {
	for cost, n := range w.Take() {
		st.want[cost] = n
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

// heldBody is a call's request body, kept while a retry may send it
// again. The transport reads it through readers from open; once the
// answer is relayed (release), the bytes go as soon as no reader is part
// way through them (one the upstream answered before it finished).
type heldBody struct {
	mu       sync.Mutex
	b        []byte
	reading  int // readers that have started and neither ended nor closed
	released bool
}

var errBodyReleased = errors.New("proxy: the call's body was already let go")

func holdBody(b []byte) *heldBody { return &heldBody{b: b} }

// open returns a reader over the body and a GetBody that opens another
// (the transport's own retry of a request it could not send).
func (h *heldBody) open() (io.ReadCloser, func() (io.ReadCloser, error)) {
	return &heldReader{h: h}, func() (io.ReadCloser, error) { return &heldReader{h: h}, nil }
}

// release lets the body go once no reader is part way through it.
func (h *heldBody) release() {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.released = true
	h.dropIfDone()
}

func (h *heldBody) dropIfDone() {
	if h.released && h.reading == 0 {
		h.b = nil
	}
}

type heldReader struct {
	h       *heldBody
	off     int
	started bool
	ended   bool // read to its end, or closed
}

func (r *heldReader) Read(p []byte) (int, error) {
	h := r.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if r.ended {
		return 0, io.EOF
	}
	if !r.started {
		if h.released {
			return 0, errBodyReleased
		}
		r.started = true
		h.reading++
	}
	n := copy(p, h.b[r.off:])
	r.off += n
	if r.off == len(h.b) {
		r.end()
		if n == 0 {
			return 0, io.EOF
		}
	}
	return n, nil
}

// end marks the reader done with the body; h.mu is held.
func (r *heldReader) end() {
	if r.started && !r.ended {
		r.h.reading--
		r.h.dropIfDone()
	}
	r.ended = true
}

func (r *heldReader) Close() error {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	r.end()
	return nil
}
