package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dunglas/httpsfv"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/pushback"
	"github.com/shaperhq/shaper/internal/wire"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/tokenbucket"
)

// The proxy: `ANY /proxy/{upstream}/{rest}` (and, with
// upstreams.NAME.proxy.listen, the root of a listener of the upstream's
// own) sends the caller's request to the upstream once its slot comes,
// booked on the very bucket state the workers book jobs on
// (jobstore.Bucket), so that calls and jobs together keep to the
// upstream's limits, and relays the answer as it comes.
//
// A call never waits in the job queue: it books the next free slot after
// those already booked (by workers up to their horizon, by other calls),
// so it waits behind booked slots, not behind queued jobs, and fair share
// among tenants' jobs does not hold calls back. A call whose slot lies
// beyond its wait is answered 429 at once and never sent; a caller that
// hangs up before its slot gives the slot back and is never sent.

// Headers the proxy reads from a call and never forwards.
const (
	headerPartition     = "Shaper-Partition"
	headerLane          = "Shaper-Lane"
	headerCost          = "Shaper-Cost"
	headerMaxWait       = "Shaper-Max-Wait"
	headerUpstreamAuth  = "Shaper-Upstream-Authorization"
	headerQueueTime     = "Shaper-Queue-Time"
	headerRetryAfterMs  = "Retry-After-Ms"
	proxyRoute          = "/proxy/{upstream}/{rest}"
	proxyPrefix         = "/proxy/"
	proxySettleMaxBytes = 64 << 10
)

// proxyMethods are the methods the OpenAPI document lists for the proxy
// route; the proxy itself relays any method.
func proxyMethods() []string {
	return []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}
}

// proxyEntry is an upstream as the proxy reaches it.
type proxyEntry struct {
	up      shaper.Upstream // with defaults
	base    *url.URL
	bucket  *leaky.Bucket
	space   jobstore.Space
	client  *http.Client
	spacing time.Duration
	costs   map[string]bool
	// adaptive is set when a limit is adaptive: a 429 to a call cuts it,
	// as one to a job does.
	adaptive bool

	marks *waitMarks
	// booker books the calls' slots, concurrent calls together.
	booker *jobstore.CallBooker
	bufs   sync.Pool // *[]byte: the buffers answers are relayed through

	mu        sync.Mutex
	stated    []leaky.Limit // what the upstream last stated to this replica
	learnedAt time.Time
}

// newProxies prepares every proxied upstream.
func (s *Server) newProxies(ups []shaper.Upstream) error {
	s.proxies = map[string]*proxyEntry{}
	s.pacer = leaky.New(s.rdb, leaky.Config{Prefix: s.cfg.Prefix, Now: s.cfg.PacerNow})
	s.drain = jobstore.NewRecorder(s.rdb, s.cfg.Prefix)
	for _, u := range ups {
		u = u.WithDefaults()
		if !u.Proxied() {
			continue
		}
		base, err := url.Parse(u.BaseURL)
		if err != nil {
			return fmt.Errorf("server: upstream %s: base URL: %w", u.Name, err)
		}
		// A call's lease lives through its request, as a job's does. A
		// call books no further ahead than a job (callLookahead), so the
		// bucket's max wait is the workers' horizon, as theirs is: a
		// change of limits then drains the old ones for as long on serve
		// as on work (docs/limits.md).
		b, err := jobstore.Bucket(s.pacer, u, u.Timeout+10*time.Second, s.callLookahead())
		if err != nil {
			return fmt.Errorf("server: upstream %s: %w", u.Name, err)
		}
		transport := s.cfg.ProxyTransport
		if transport == nil {
			transport = &http.Transport{
				Proxy:                 http.ProxyFromEnvironment,
				DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
				MaxIdleConns:          256,
				MaxIdleConnsPerHost:   256,
				IdleConnTimeout:       90 * time.Second,
				TLSHandshakeTimeout:   10 * time.Second,
				ForceAttemptHTTP2:     true,
				ResponseHeaderTimeout: u.Timeout,
			}
		}
		e := &proxyEntry{up: u, base: base, bucket: b, space: jobstore.For(s.cfg.Prefix, u.Name), costs: map[string]bool{},
			client: &http.Client{
				Transport: transport,
				// The caller's SDK follows redirects if it wants to.
				CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			}}
		ls := make([]leaky.LimitState, len(u.Limits))
		for i, l := range u.Limits {
			ls[i] = leaky.LimitState{Limit: l, Rate: float64(l.Rate)}
			if l.Cost != "" {
				e.costs[l.Cost] = true
			}
			e.adaptive = e.adaptive || l.Adaptive
		}
		e.spacing = pushback.Spacing(ls, b.Guard())
		e.marks = s.newWaitMarks(e)
		e.booker = jobstore.NewCallBooker(s.rdb, e.space)
		e.bufs.New = func() any { b := make([]byte, relayBufBytes); return &b }
		s.proxies[u.Name] = e
		s.m.InitProxy(u.Name)
	}
	return nil
}

// Run does the API's background work until ctx ends: it adds proxied
// calls to the fleet's drain counts and hears of blocks other replicas
// place, so that a call booked before a block does not go out under it.
func (s *Server) Run(ctx context.Context) {
	if len(s.proxies) == 0 {
		<-ctx.Done()
		return
	}
	done := make(chan struct{})
	// The proxy's buckets pace at the limits operators set, as the
	// workers' do (PUT /v1/upstreams/{name}/limits), booking the same
	// generation of TAT keys.
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		buckets := make([]*leaky.Bucket, 0, len(s.proxies))
		for _, e := range s.proxies {
			buckets = append(buckets, e.bucket)
		}
		for ctx.Err() == nil {
			if err := s.pacer.Follow(ctx, buckets, nil); err != nil {
				s.log.Warn("proxy cannot follow changes of limits", "err", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if err := s.pacer.Watch(ctx); err != nil {
				s.log.Warn("cannot watch for upstream blocks", "err", err)
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	s.drain.Run(ctx, time.Second)
	<-done
	<-followed
}

// ProxyHandler serves upstream name's proxy at the root of a listener
// (upstreams.NAME.proxy.listen); nil if the upstream is not proxied.
func (s *Server) ProxyHandler(name string) http.Handler {
	e, ok := s.proxies[name]
	if !ok {
		return nil
	}
	return s.measured("listen "+name, s.authed(func(w http.ResponseWriter, r *http.Request) {
		s.proxy(w, r, e, r.URL.EscapedPath())
	}))
}

// handleProxy serves /proxy/{upstream}/{rest}. It reads the path as it
// came, escaped, so that the percent-encoding the caller chose is what
// the upstream sees.
func (s *Server) handleProxy(w http.ResponseWriter, r *http.Request) {
	raw := strings.TrimPrefix(r.URL.EscapedPath(), proxyPrefix)
	name, rest, _ := strings.Cut(raw, "/")
	e, ok := s.proxies[name]
	if !ok {
		detail := fmt.Sprintf("no upstream %q to proxy to", name)
		if u, known := s.ups[name]; known {
			switch {
			case u.BaseURL == "":
				detail = fmt.Sprintf("upstream %s is served by a Go handler, not over HTTP: enqueue jobs for it", name)
			default:
				detail = fmt.Sprintf("upstream %s is not proxied (upstreams.%s.proxy.enabled is false)", name, name)
			}
		}
		writeProblem(w, problem{Type: problemNotFound, Title: "Unknown upstream", Status: http.StatusNotFound, Detail: detail})
		s.m.ProxyCalls.WithLabelValues(notProxied, "404").Inc()
		return
	}
	s.proxy(w, r, e, "/"+rest)
}

// notProxied labels calls to no proxied upstream: a metric label never
// takes a name from the request.
const notProxied = "(unknown)"

// callSpec is what a call asks for, read from its Shaper-* headers.
type callSpec struct {
	partition string
	lane      string
	costs     leaky.Costs
	maxWait   time.Duration
	target    *url.URL
	method    string
	header    http.Header // as sent (outboundHeaders)
	hasBody   bool
	held      *heldBody // the body, until no retry can need it
}

// readCall checks a call's path and Shaper-* headers.
func (s *Server) readCall(r *http.Request, e *proxyEntry, path string) (callSpec, *fieldProblems) {
	p := &fieldProblems{}
	c := callSpec{maxWait: e.up.Proxy.MaxWait, costs: leaky.Costs{}}
	if r.URL.RawQuery != "" || r.URL.ForceQuery {
		path += "?" + r.URL.RawQuery
	}
	t, err := targetOf(e.base, path)
	if err != nil {
		p.add("path", "%v", err)
	}
	c.target = t
	h := r.Header
	if v := h.Get(headerMaxWait); v != "" {
		secs, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		switch {
		case err != nil || math.IsNaN(secs) || secs < 0:
			p.add(headerMaxWait, "%q: want seconds, a number of 0 or more (e.g. 10 or 2.5)", v)
		default:
			c.maxWait = min(c.maxWait, time.Duration(secs*float64(time.Second)))
		}
	}
	if v := h.Get(headerLane); v != "" {
		if !e.up.HasLane(v) {
			p.add(headerLane, "no lane %q on upstream %s (lanes: %s)", v, e.up.Name, strings.Join(e.up.LaneNames(), ", "))
		}
		c.lane = v
	}
	if v := h.Get(headerPartition); v != "" {
		if err := shaper.CheckPartition(v); err != nil {
			p.add(headerPartition, "%v", err)
		}
		c.partition = v
	} else if cred := h.Get(headerUpstreamAuth); cred != "" && e.up.HasPartitionLimits() {
		// Each caller's own credential is its own quota at the upstream.
		sum := sha256.Sum256([]byte(cred))
		c.partition = "cred:" + hex.EncodeToString(sum[:12])
	}
	if vs := h.Values(headerCost); len(vs) > 0 {
		d, err := httpsfv.UnmarshalDictionary(vs)
		if err != nil {
			p.add(headerCost, "not a structured-field dictionary of whole numbers (e.g. tokens=1200): %v", err)
		} else {
			for _, name := range d.Names() {
				m, _ := d.Get(name)
				item, ok := m.(httpsfv.Item)
				n, isInt := item.Value.(int64)
				switch {
				case !ok || !isInt || n < 0:
					p.add(headerCost, "%s: want a whole number of 0 or more (e.g. %s=1200)", name, name)
				case !e.costs[name]:
					p.add(headerCost, "%s: no limit of upstream %s counts it (costs: %s)", name, e.up.Name, costList(e.costs))
				default:
					c.costs[name] = n
				}
			}
		}
	}
	return c, p
}

func costList(m map[string]bool) string {
	if len(m) == 0 {
		return "none; the limits count requests"
	}
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return strings.Join(sortedStrings(out), ", ")
}

// checkCalledCosts refuses costs no slot could carry.
func checkCalledCosts(p *fieldProblems, e *proxyEntry, c callSpec) {
	if err := e.bucket.CheckCosts(c.costs); err != nil {
		p.add(headerCost, "%v", err)
	}
	for _, l := range e.up.PartitionLimitsFor(c.partition) {
		if l.Cost != "" && c.costs[l.Cost] > l.Capacity() {
			p.add(headerCost, "%s %d exceeds what partition %q's limit %v lets through at once (%d)", l.Cost, c.costs[l.Cost], c.partition, l, l.Capacity())
		}
	}
}

// outboundHeaders are the caller's headers as the upstream gets them:
// without the caller's shaper key, any Shaper-* header or hop-by-hop
// header (RFC 9110 §7.6.1, and those Connection names), with the
// upstream's configured headers added and the caller's own credential
// (Shaper-Upstream-Authorization) as Authorization.
func outboundHeaders(in http.Header, configured map[string]string) http.Header {
	out := make(http.Header, len(in)+len(configured))
	drop := hopHeaders(in)
	for k, vs := range in {
		ck := textproto.CanonicalMIMEHeaderKey(k)
		if drop.has(ck) || ck == "Authorization" || ck == "X-Api-Key" || ck == "Host" || ck == "Content-Length" ||
			strings.HasPrefix(ck, "Shaper-") {
			continue
		}
		out[ck] = vs
	}
	for k, v := range configured {
		out.Set(k, v)
	}
	if cred := in.Get(headerUpstreamAuth); cred != "" {
		out.Set("Authorization", cred)
	}
	return out
}

// hopHeaders are the hop-by-hop headers of h: those RFC 9110 §7.6.1 names
// (and Proxy-Authorization, this hop's credential) and any its Connection
// header lists.
func hopHeaders(h http.Header) hopSet {
	var listed hopSet
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				if listed == nil {
					listed = hopSet{}
				}
				listed[textproto.CanonicalMIMEHeaderKey(name)] = true
			}
		}
	}
	return listed
}

// hopSet is the names a Connection header lists (nil for none, as for
// most calls, so that nothing is allocated for them).
type hopSet map[string]bool

// has reports whether the canonical name is hop-by-hop: a name RFC 9110
// §7.6.1 gives (or Proxy-Authorization, this hop's credential), or one
// Connection listed.
func (d hopSet) has(name string) bool {
	switch name {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Te", "Transfer-Encoding", "Upgrade", "Trailer",
		"Proxy-Authorization", "Proxy-Authenticate":
		return true
	}
	return d[name]
}

// answerSlotRefused is shaper's 429 for a call whose slot lies beyond its
// wait: nothing was sent, and after says when a call waiting as long
// could get a slot.
func (s *Server) answerSlotRefused(w http.ResponseWriter, e *proxyEntry, after time.Duration, why string) {
	secs := max(1, int64(math.Ceil(after.Seconds())))
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	w.Header().Set(headerRetryAfterMs, strconv.FormatInt(max(1, int64(math.Ceil(float64(after)/float64(time.Millisecond)))), 10))
	writeProblem(w, problem{Type: wire.TypeRateLimited, Title: "No send slot within the wait", Status: http.StatusTooManyRequests,
		Detail:     fmt.Sprintf("upstream %s has no send slot within this call's wait (%s); nothing was sent: retry in %v", e.up.Name, why, after.Round(time.Millisecond)),
		RetryAfter: secs})
}

// admitCall charges a call's admission token as an enqueue's, on its
// own; refused, it answers shaper's own 429 with admission's rate-limit
// headers, which names admission, not the upstream. A call on a single
// Redis server pays it in its booking's script call instead (callAdmit).
func (s *Server) admitCall(w http.ResponseWriter, r *http.Request) (bool, string) {
	res, err := s.admission.Allow(r.Context(), caller(r).Name, 1)
	return s.admitted(w, r, res, err)
}

// admitted answers a call admission refused or could not decide, and
// counts one it allowed.
func (s *Server) admitted(w http.ResponseWriter, r *http.Request, res shaper.Result, err error) (bool, string) {
	if err != nil {
		s.internalError(w, r, "admission", err)
		return false, "503"
	}
	if !res.Allowed {
		s.refuseCall(w, r, res)
		return false, "429"
	}
	s.m.AdmissionDecisions.WithLabelValues("allowed").Inc()
	return true, ""
}

// admitFailed decides a call's admission under admission's policy for a
// Redis that fails, after the script call that was to decide it failed
// with err; on a CROSSSLOT error (a proxy in front of several shards that
// a plain client cannot tell from one Redis) calls pay admission on their
// own from then on.
func (s *Server) admitFailed(w http.ResponseWriter, r *http.Request, err error) (bool, string) {
	if strings.Contains(err.Error(), "CROSSSLOT") && s.callAdmission.Swap(nil) != nil {
		s.log.Warn("Redis refused a proxied call's admission and booking in one script call (CROSSSLOT): calls pay admission on their own from now on", "err", err)
	}
	res, err := s.admission.Decide(r.Context(), caller(r).Name, 1, err)
	return s.admitted(w, r, res, err)
}

// callAdmit is the admission a call pays in its booking's script call,
// or nil when it pays on its own first (admitCall): on a Redis Cluster,
// or for a key name the bucket cannot take, which Allow answers.
func (s *Server) callAdmit(r *http.Request) *tokenbucket.Admission {
	tb := s.callAdmission.Load()
	if tb == nil {
		return nil
	}
	a, err := tb.Admission(caller(r).Name, 1)
	if err != nil {
		return nil
	}
	return &a
}

// refuseCall answers a call admission refused: shaper's own 429 with
// admission's rate-limit headers, naming admission, not the upstream.
// Only a refusal carries them: on an answer relayed from the upstream
// they would pass for the upstream's.
func (s *Server) refuseCall(w http.ResponseWriter, r *http.Request, res shaper.Result) {
	writeRateHeaders(w, s, res)
	s.m.AdmissionDecisions.WithLabelValues("denied").Inc()
	secs := max(1, int64(math.Ceil(res.RetryAfter.Seconds())))
	writeProblem(w, problem{Type: wire.TypeRateLimited, Title: "Admission limit exceeded", Status: http.StatusTooManyRequests,
		Detail:     fmt.Sprintf("key %s is over shaper's admission limit (api.admission), not the upstream's: retry in %d s; nothing was sent", caller(r).Name, secs),
		RetryAfter: secs})
}

// errSlotGone is a slot that could not be used (woke too late, or a block
// came over it): the call books again.
var errSlotGone = errors.New("slot gone")
