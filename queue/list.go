package queue

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
)

// Bounds of a List page.
const (
	// DefaultListLimit is the jobs a page holds when the caller names no
	// limit; MaxListLimit is the most it may ask for.
	DefaultListLimit = 50
	MaxListLimit     = 200
	// ListScanFactor bounds the work of one page: it examines at most
	// ListScanFactor × limit index entries (each a job read, or one
	// skipped without a read because its ID shows another tenant or
	// lane). A page that reaches the bound before it is full is returned
	// short, with a cursor to go on from.
	ListScanFactor = 4
)

// ErrBadCursor: a List cursor that this query did not hand out.
var ErrBadCursor = errors.New("invalid cursor")

// ListOptions select the jobs of one upstream that List returns.
type ListOptions struct {
	Upstream string
	// Tenant, when set, limits the list to that tenant's jobs (as Get
	// does: by the tag in the ID first, then the job's stored tenant).
	Tenant string
	// State, when set, keeps only jobs in that state; empty is every
	// state.
	State State
	// Lane and Partition, when set, keep only jobs of that lane or
	// partition.
	Lane      string
	Partition string
	// Limit is the most jobs a page holds, 1 to MaxListLimit; zero is
	// DefaultListLimit.
	Limit int
	// Cursor is the NextCursor of the page before; empty starts at the
	// top.
	Cursor string
}

// Page is one page of a List.
type Page struct {
	Jobs []*Info
	// NextCursor continues the list; empty when the list is done. A page
	// can hold fewer than Limit jobs (even none) with a NextCursor: it
	// stopped at its bound on work (ListScanFactor).
	NextCursor string
}

// An index is one of asynq's per-state structures of a queue, read newest
// first. A listing walks the indexes its state needs, one after another.
type index uint8

const (
	idxActive    index = iota + 1 // the active list, newest taken first
	idxQueued                     // the flows (asynq groups), newest enqueued first
	idxScheduled                  // the scheduled set, latest due first
	idxRetry                      // the retry set, latest due first
	idxArchived                   // the archived set, latest died first
	idxCompleted                  // the completed set, latest finished first
)

// indexesFor lists the indexes that hold jobs in state s ("" every state),
// in the order a listing walks them. A job's state is always what Get says
// (retry holds both retrying jobs and jobs handed back to wait, which are
// scheduled; archived holds dead and cancelled jobs), so each index's jobs
// are read and kept only if Get's state is the one asked for.
func indexesFor(s State) ([]index, bool) {
	switch s {
	case "":
		return []index{idxActive, idxQueued, idxScheduled, idxRetry, idxArchived, idxCompleted}, true
	case StateQueued:
		return []index{idxQueued}, true
	case StateScheduled:
		// A job waiting in its flow reads scheduled while a pause, a
		// pushback or its partition's limit holds it (waiting_for).
		return []index{idxQueued, idxScheduled, idxRetry}, true
	case StateRetrying:
		return []index{idxRetry}, true
	case StateActive:
		return []index{idxActive}, true
	case StateSucceeded:
		return []index{idxCompleted}, true
	case StateDead, StateCancelled:
		return []index{idxArchived}, true
	}
	return nil, false
}

// asynqState is the task hash's state field of the jobs an index holds;
// an entry whose task says otherwise has moved on since.
func (i index) asynqState() string {
	switch i {
	case idxActive:
		return "active"
	case idxQueued:
		return "aggregating"
	case idxScheduled:
		return "scheduled"
	case idxRetry:
		return "retry"
	case idxArchived:
		return "archived"
	}
	return "completed"
}

// ValidState reports whether s names a job state.
func ValidState(s State) bool {
	_, ok := indexesFor(s)
	return ok && s != ""
}

// cursor is where a listing stopped: the index (its position in the walk),
// and the last entry read there (its score, or its position in a list, and
// its member). Query is a digest of the listing's options, so a cursor is
// refused by any other listing.
type cursor struct {
	Step   int    `json:"i"`
	Score  string `json:"s,omitempty"`
	Member string `json:"m,omitempty"`
	Query  string `json:"q"`
}

func (c cursor) encode() string {
	b, _ := json.Marshal(c) // only strings and an int
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s, query string, steps int) (cursor, error) {
	var c cursor
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || json.Unmarshal(b, &c) != nil {
		return c, fmt.Errorf("cursor %q: not one this API handed out: %w", s, ErrBadCursor)
	}
	if c.Query != query {
		return c, fmt.Errorf("cursor: it belongs to a listing with other upstream, state, lane or partition: %w", ErrBadCursor)
	}
	if c.Step < 0 || c.Step >= steps {
		return c, fmt.Errorf("cursor: not one this API handed out: %w", ErrBadCursor)
	}
	if c.Score != "" {
		if _, err := strconv.ParseFloat(c.Score, 64); err != nil {
			return c, fmt.Errorf("cursor: not one this API handed out: %w", ErrBadCursor)
		}
	}
	return c, nil
}

// cursorFits reports whether a cursor's position can be one of idx's: a
// position in the active list or a flow sequence is a whole number at or
// above zero, a sorted set's score a finite number. Anything else would
// reach Redis as an error (and count as Redis failing) rather than as the
// client's bad cursor.
func cursorFits(idx index, score string) bool {
	if score == "" {
		return true
	}
	// Only the characters Redis writes a number with: Go also parses hex,
	// underscores, "inf" and "nan", which Redis would refuse.
	if strings.TrimLeft(score, "0123456789.eE+-") != "" {
		return false
	}
	switch idx {
	case idxActive, idxQueued:
		n, err := strconv.ParseInt(score, 10, 64)
		return err == nil && n >= 0 && n < 1<<53
	}
	f, err := strconv.ParseFloat(score, 64)
	return err == nil && !math.IsNaN(f) && !math.IsInf(f, 0)
}

func queryDigest(o ListOptions) string {
	sum := sha256.Sum256([]byte(strings.Join([]string{o.Upstream, o.Tenant, string(o.State), o.Lane, o.Partition}, "\x00")))
	return hex.EncodeToString(sum[:6])
}

// entry is one index entry as a page read it.
type entry struct {
	id, score string
	// state and partition are the task hash's fields when the entry was
	// read ("" unknown).
	state, partition string
	known            bool
}

// List returns a page of an upstream's jobs, newest first within each
// index it walks (see indexesFor): the jobs being sent, then queued ones
// (newest enqueued first), scheduled, retrying or waiting (latest due
// first), dead and cancelled (latest died first), and succeeded (latest
// finished first). It reads asynq's per-state indexes and the upstream's
// flows, never every key, and examines at most ListScanFactor × Limit
// entries per page (plus, for queued jobs, one read per flow the filters
// leave: a flow is a lane, fairness key and partition).
//
// A job that stays in its state while the caller pages is listed exactly
// once; one that changes state meanwhile may be listed in both states, or
// in neither. Each job is read as Get reads it.
//
// With no Upstream it lists every upstream's jobs, one upstream after
// another in name order (each as above), visiting at most
// ListUpstreamsPerPage upstreams a page; a Lane then keeps the upstreams
// that have that lane.
func (q *Queue) List(ctx context.Context, o ListOptions) (*Page, error) {
	if o.Upstream == "" {
		return q.listEvery(ctx, o)
	}
	return q.listOne(ctx, o)
}

// ListUpstreamsPerPage is the most upstreams one page of a listing of
// every upstream visits, so that a page's work stays bounded however many
// upstreams are configured.
const ListUpstreamsPerPage = 16

// everyCursor is where a listing of every upstream stopped: in upstream
// Up, at its own listing's cursor C ("" from its start).
type everyCursor struct {
	Query string `json:"q"`
	Up    string `json:"u"`
	C     string `json:"c,omitempty"`
}

func (c everyCursor) encode() string {
	b, _ := json.Marshal(c) // only strings
	return "a" + base64.RawURLEncoding.EncodeToString(b)
}

func (q *Queue) listEvery(ctx context.Context, o ListOptions) (*Page, error) {
	if _, ok := indexesFor(o.State); !ok {
		return nil, fmt.Errorf("state %q: not a job state: %w", o.State, shaper.ErrInvalid)
	}
	switch {
	case o.Limit == 0:
		o.Limit = DefaultListLimit
	case o.Limit < 0 || o.Limit > MaxListLimit:
		return nil, fmt.Errorf("limit %d: must be 1 to %d: %w", o.Limit, MaxListLimit, shaper.ErrInvalid)
	}
	var names []string
	for _, name := range slices.Sorted(maps.Keys(q.ups)) {
		if o.Lane == "" || q.ups[name].HasLane(o.Lane) {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("lane %q: no upstream has it: %w", o.Lane, ErrUnknownLane)
	}
	query := queryDigest(o)
	at, inner := 0, ""
	if o.Cursor != "" {
		bad := fmt.Errorf("cursor: not one this API handed out, or from a listing with other upstream, state, lane or partition: %w", ErrBadCursor)
		b, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(o.Cursor, "a"))
		var c everyCursor
		if !strings.HasPrefix(o.Cursor, "a") || err != nil || json.Unmarshal(b, &c) != nil || c.Query != query {
			return nil, bad
		}
		if at = slices.Index(names, c.Up); at < 0 {
			return nil, bad
		}
		inner = c.C
	}
	page := &Page{}
	for i := at; i < len(names); i++ {
		if i-at == ListUpstreamsPerPage {
			page.NextCursor = everyCursor{Query: query, Up: names[i]}.encode()
			return page, nil
		}
		sub := o
		sub.Upstream, sub.Limit, sub.Cursor = names[i], o.Limit-len(page.Jobs), inner
		inner = ""
		p, err := q.listOne(ctx, sub)
		if err != nil {
			return nil, err
		}
		page.Jobs = append(page.Jobs, p.Jobs...)
		switch {
		case p.NextCursor != "":
			page.NextCursor = everyCursor{Query: query, Up: names[i], C: p.NextCursor}.encode()
			return page, nil
		case len(page.Jobs) >= o.Limit && i+1 < len(names):
			page.NextCursor = everyCursor{Query: query, Up: names[i+1]}.encode()
			return page, nil
		}
	}
	return page, nil
}

func (q *Queue) listOne(ctx context.Context, o ListOptions) (*Page, error) {
	u, ok := q.ups[o.Upstream]
	if !ok {
		return nil, fmt.Errorf("upstream %q: %w", o.Upstream, ErrUnknownUpstream)
	}
	steps, ok := indexesFor(o.State)
	if !ok {
		return nil, fmt.Errorf("state %q: not a job state: %w", o.State, shaper.ErrInvalid)
	}
	if o.Lane != "" && !u.HasLane(o.Lane) {
		return nil, fmt.Errorf("lane %q of upstream %s (lanes: %s): %w", o.Lane, o.Upstream, strings.Join(u.LaneNames(), ", "), ErrUnknownLane)
	}
	if o.Partition != "" {
		if err := shaper.CheckPartition(o.Partition); err != nil {
			return nil, fmt.Errorf("partition: %v: %w", err, shaper.ErrInvalid)
		}
	}
	switch {
	case o.Limit == 0:
		o.Limit = DefaultListLimit
	case o.Limit < 0 || o.Limit > MaxListLimit:
		return nil, fmt.Errorf("limit %d: must be 1 to %d: %w", o.Limit, MaxListLimit, shaper.ErrInvalid)
	}
	query := queryDigest(o)
	cur := cursor{Query: query}
	if o.Cursor != "" {
		var err error
		if cur, err = decodeCursor(o.Cursor, query, len(steps)); err != nil {
			return nil, err
		}
		if !cursorFits(steps[cur.Step], cur.Score) {
			return nil, fmt.Errorf("cursor: not one this API handed out: %w", ErrBadCursor)
		}
	}
	l := &lister{q: q, u: u, o: o, keys: jobstore.AsynqKeys(jobstore.QueueName(o.Upstream)), budget: ListScanFactor * o.Limit}
	page := &Page{}
	for ; cur.Step < len(steps); cur = (cursor{Step: cur.Step + 1, Query: query}) {
		next, done, err := l.walk(ctx, steps[cur.Step], cur, page)
		if err != nil {
			return nil, fmt.Errorf("list jobs of %s: %w", o.Upstream, err)
		}
		if !done {
			page.NextCursor = next.encode()
			return page, nil
		}
	}
	return page, nil
}

// lister is one page's walk.
type lister struct {
	q      *Queue
	u      shaper.Upstream
	o      ListOptions
	keys   jobstore.Keys
	budget int // entries still to examine
	// owed is Redis work a read did beyond the entries it returned (one
	// range read per flow), charged to budget once its entries are seen.
	owed int
}

// full reports whether the page has what it may hold, or did all the work
// it may do.
func (l *lister) full(p *Page) bool { return len(p.Jobs) >= l.o.Limit || l.budget <= 0 }

// walk reads one index from cur on, adding its jobs to p. It returns done
// when the index has nothing left, else the cursor to go on from.
func (l *lister) walk(ctx context.Context, idx index, cur cursor, p *Page) (cursor, bool, error) {
	for !l.full(p) {
		batch, exhausted, err := l.read(ctx, idx, cur, min(l.budget, 500))
		if err != nil {
			return cur, false, err
		}
		for _, e := range batch {
			if l.full(p) {
				return cur, false, nil
			}
			l.budget--
			cur.Score, cur.Member = e.score, e.id
			info, err := l.examine(ctx, idx, e)
			if err != nil {
				return cur, false, err
			}
			if info != nil {
				p.Jobs = append(p.Jobs, info)
			}
		}
		l.budget -= l.owed
		l.owed = 0
		if exhausted {
			return cur, true, nil
		}
	}
	return cur, false, nil
}

// examine reads one entry's job, or returns nil when it is not one to
// list: another tenant's, lane or partition, gone, or in another state.
func (l *lister) examine(ctx context.Context, idx index, e entry) (*Info, error) {
	_, lane, err := ParseID(e.id)
	if err != nil {
		return nil, nil
	}
	if l.o.Lane != "" && lane != l.o.Lane {
		return nil, nil
	}
	if l.o.Tenant != "" && foreignID(e.id, l.o.Tenant) {
		return nil, nil
	}
	if e.known && (e.state != idx.asynqState() || l.o.Partition != "" && e.partition != l.o.Partition) {
		// Moved on since it was indexed, or of another partition.
		return nil, nil
	}
	info, err := l.q.Get(ctx, e.id, l.o.Tenant)
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if l.o.State != "" && info.State != l.o.State || l.o.Partition != "" && info.Partition != l.o.Partition || l.o.Lane != "" && info.Lane != l.o.Lane {
		return nil, nil
	}
	return info, nil
}

// read returns up to n entries of an index after cur, and whether the
// index has none after them.
func (l *lister) read(ctx context.Context, idx index, cur cursor, n int) ([]entry, bool, error) {
	if idx == idxQueued {
		return l.readFlows(ctx, cur, n)
	}
	which := map[index]jobstore.Index{idxActive: jobstore.IndexActive, idxScheduled: jobstore.IndexScheduled,
		idxRetry: jobstore.IndexRetry, idxArchived: jobstore.IndexArchived}[idx]
	if which == 0 {
		which = jobstore.IndexCompleted
	}
	rows, err := l.keys.ReadIndex(ctx, l.q.rdb, which, cur.Score, cur.Member, n)
	if err != nil {
		return nil, false, err
	}
	out := make([]entry, len(rows))
	for i, r := range rows {
		out[i] = entry{id: r.ID, score: r.Score, state: r.State, partition: r.Partition, known: true}
	}
	return out, len(out) < n, nil
}

// readFlows merges the flows (asynq groups "LANE|FK|PK", scored by FIFO
// sequence, which is unique within an upstream) that may hold the
// listing's jobs, newest first, after the sequence in cur. Each flow gives
// at most k entries, k so that all together give about n; the merge is
// exact down to the highest last entry of a flow that gave all k, and is
// cut there.
func (l *lister) readFlows(ctx context.Context, cur cursor, n int) ([]entry, bool, error) {
	names, err := l.q.rdb.SMembers(ctx, l.keys.Groups()).Result()
	if err != nil {
		return nil, false, err
	}
	names = slices.DeleteFunc(names, func(g string) bool { return !l.flowMatches(g) })
	if len(names) == 0 {
		return nil, true, nil
	}
	// Each flow read is work: it is charged to the page's budget, and each
	// flow gives at least minFlowRead entries (or n, if fewer), so that the
	// merge, exact only down to the highest last entry of a flow that gave
	// all k, yields at least that many, however many flows there are.
	k := max(min(n, minFlowRead), int(math.Ceil(float64(n)/float64(len(names)))))
	// But one read never pulls more than maxFlowEntries entries in all
	// (at least one a flow): with very many flows a page reads each once.
	k = max(1, min(k, maxFlowEntries/len(names)))
	l.owed += len(names)
	hi := "+inf"
	if cur.Score != "" {
		hi = "(" + cur.Score
	}
	pipe := l.q.rdb.Pipeline()
	cmds := make([]*redis.ZSliceCmd, len(names))
	for i, g := range names {
		cmds[i] = pipe.ZRevRangeByScoreWithScores(ctx, l.keys.Group(g), &redis.ZRangeBy{Max: hi, Min: "-inf", Count: int64(k)})
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, false, err
	}
	var all []redis.Z
	cut := math.Inf(-1)
	for _, c := range cmds {
		zs := c.Val()
		if len(zs) == k {
			cut = math.Max(cut, zs[k-1].Score)
		}
		all = append(all, zs...)
	}
	slices.SortFunc(all, func(a, b redis.Z) int {
		switch {
		case a.Score > b.Score:
			return -1
		case a.Score < b.Score:
			return 1
		}
		return 0
	})
	out := make([]entry, 0, len(all))
	for _, z := range all {
		if z.Score < cut {
			break
		}
		id, _ := z.Member.(string)
		out = append(out, entry{id: id, score: strconv.FormatFloat(z.Score, 'f', -1, 64)})
	}
	return out, cut == math.Inf(-1), nil
}

// minFlowRead is the fewest entries readFlows reads of each flow, and
// maxFlowEntries the most it reads of all flows together, unless there are
// more flows than that (then one entry each).
const (
	minFlowRead    = 20
	maxFlowEntries = 20_000
)

// flowMatches reports whether flow g ("LANE|FK|PK") can hold the
// listing's jobs. It only saves reads: each job is checked on its own too.
func (l *lister) flowMatches(g string) bool {
	lane, rest, ok := strings.Cut(g, "|")
	if !ok || l.o.Lane != "" && lane != l.o.Lane {
		return false
	}
	if l.o.Partition != "" && !strings.HasSuffix(rest, "|"+l.o.Partition) {
		return false
	}
	if l.o.Tenant != "" && l.u.Fairness.By != shaper.FairByPartition && l.u.Fairness.By != shaper.FairByNone {
		// Fair by tenant: the fairness key is the tenant.
		return strings.HasPrefix(rest, jobstore.FairKey(l.u, l.o.Tenant, "")+"|")
	}
	return true
}
