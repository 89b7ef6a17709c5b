package server

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/tokenbucket"
)

func TestParseWait(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		err  string
	}{
		{"30s", 30 * time.Second, ""},
		{"1m", time.Minute, ""},
		{"1500ms", 1500 * time.Millisecond, ""},
		{"30", 30 * time.Second, ""},
		{"2.5", 2500 * time.Millisecond, ""},
		{"0", 0, ""},
		{"60", 60 * time.Second, ""},
		{"61s", 0, "at most 1m0s"},
		{"61", 0, "at most 1m0s"},
		{"1e300", 0, "at most 1m0s"},
		{"-1s", 0, "must not be negative"},
		{"-1", 0, "must not be negative"},
		{"soon", 0, "must be a duration"},
		{"", 0, "must be a duration"},
		{"NaN", 0, "must be a duration"},
	} {
		got, err := parseWait(tc.in)
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("parseWait(%q): got %v, %v; want %v", tc.in, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("parseWait(%q): got %v, %v; want an error saying %q", tc.in, got, err, tc.err)
		}
	}
}

func TestPreferWait(t *testing.T) {
	for _, tc := range []struct {
		prefer []string
		want   int64
		ok     bool
	}{
		{[]string{"wait=30"}, 30, true},
		{[]string{"respond-async, wait=5"}, 5, true},
		{[]string{"WAIT = 7 ; x=y"}, 7, true},
		{[]string{`wait="9"`}, 9, true},
		{[]string{"handling=lenient", "wait=3"}, 3, true},
		{[]string{"wait=600"}, 60, true},
		{[]string{"wait=0"}, 0, true},
		{[]string{"wait=2, wait=9"}, 2, true},
		{[]string{"wait"}, 0, false},
		{[]string{"wait=soon"}, 0, false},
		{[]string{"wait=-1"}, 0, false},
		{[]string{"wait=1.5"}, 0, false},
		{[]string{"respond-async"}, 0, false},
		{nil, 0, false},
	} {
		h := http.Header{}
		for _, v := range tc.prefer {
			h.Add("Prefer", v)
		}
		got, ok := preferWait(h)
		if got != tc.want || ok != tc.ok {
			t.Errorf("preferWait(%q): got %d, %v; want %d, %v", tc.prefer, got, ok, tc.want, tc.ok)
		}
	}
}

// worker takes and finishes the fixture's stripe jobs as shaper's workers
// do, announcing the final ones.
type worker struct {
	t     *testing.T
	f     *fixture
	space jobstore.Space
	taker *jobstore.Taker
}

func newWorker(t *testing.T, f *fixture) *worker {
	t.Helper()
	u, _ := f.q.Upstream("stripe")
	bucket, err := leaky.New(f.rdb, leaky.Config{}).Bucket(jobstore.QueueName("stripe"), leaky.BucketConfig{Limits: []leaky.Limit{leaky.PerSecond(1000)}})
	if err != nil {
		t.Fatal(err)
	}
	space := jobstore.For("", "stripe")
	taker, err := jobstore.NewTaker(f.rdb, space, jobstore.TakerConfig{Upstream: u, Bucket: bucket,
		Lookahead: time.Second, Lease: 30 * time.Second, ConcurrencyLease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return &worker{t: t, f: f, space: space, taker: taker}
}

// finish takes the next n jobs and ends them with outcome (a success
// answers 200 "paid"); it returns their ids.
func (w *worker) finish(n int, outcome jobstore.Outcome) []string {
	w.t.Helper()
	ctx := context.Background()
	tk, err := w.taker.Take(ctx, n)
	if err != nil || len(tk.Jobs) != n {
		w.t.Fatalf("took %d jobs, %v; want %d", len(tk.Jobs), err, n)
	}
	var items []jobstore.Finished
	var ids []string
	for _, j := range tk.Jobs {
		msg, err := jobstore.Unmarshal(j.Msg)
		if err != nil {
			w.t.Fatal(err)
		}
		it := jobstore.Finished{ID: j.ID, Lane: "default", Msg: msg, Outcome: outcome, Retention: time.Hour, ErrMsg: "upstream said 400"}
		if outcome == jobstore.Succeeded {
			it.Result = []byte(`{"v":2,"s":200,"b":"paid"}`)
		}
		items = append(items, it)
		ids = append(ids, j.ID)
	}
	if _, err := jobstore.Finish(ctx, w.f.rdb, jobstore.AsynqKeys(jobstore.QueueName("stripe")), w.space.CountsKey(), w.space.BacklogKey(),
		items, jobstore.AnnounceFinal(jobstore.FinalChannel(""))); err != nil {
		w.t.Fatal(err)
	}
	return ids
}

const stripeJob = `{"upstream":"stripe","method":"POST","path":"/v1/charges"}`

// answer is one HTTP exchange run in the background.
type answer struct {
	resp *http.Response
	body map[string]any
	at   time.Time
}

// start sends a request in the background; the channel gets its answer.
func (f *fixture) start(method, path, body string, headers ...string) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		resp, got := f.do(method, path, body, headers...)
		ch <- answer{resp, got, time.Now()}
	}()
	return ch
}

// untilWaiting waits for n long polls to be waiting in the fixture's
// queue (a test's synchronisation on an in-process counter, not Redis).
func (f *fixture) untilWaiting(n int) {
	f.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for f.q.Waiters() != n {
		if time.Now().After(deadline) {
			f.t.Fatalf("%d long polls waiting, want %d", f.q.Waiters(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func received(t *testing.T, ch <-chan answer, within time.Duration) answer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(within):
		t.Fatalf("no answer within %v", within)
	}
	panic("unreachable")
}

// TestLongPollAnswersWhenFinal: GET ?wait= answers within 50 ms of the job
// becoming final, succeeded (with its response), dead or cancelled.
func TestLongPollAnswersWhenFinal(t *testing.T) {
	f := newFixture(t, tokenbucket.Limit{Capacity: 100, Refill: 100, Per: time.Second}, 0)
	w := newWorker(t, f)
	for _, tc := range []struct {
		name  string
		end   func(id string) time.Time
		state string
	}{
		{"succeeded", func(string) time.Time { w.finish(1, jobstore.Succeeded); return time.Now() }, "succeeded"},
		{"dead", func(string) time.Time { w.finish(1, jobstore.Dead); return time.Now() }, "dead"},
		{"cancelled", func(id string) time.Time {
			if resp, got := f.do("DELETE", "/v1/jobs/"+id, ""); resp.StatusCode != 200 {
				t.Fatalf("cancel: %d %v", resp.StatusCode, got)
			}
			return time.Now()
		}, "cancelled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, job := f.do("POST", "/v1/jobs", stripeJob)
			id := job["id"].(string)
			ch := f.start("GET", "/v1/jobs/"+id+"?wait=10s", "")
			f.untilWaiting(1)
			ended := tc.end(id)
			a := received(t, ch, 5*time.Second)
			lag := a.at.Sub(ended)
			if a.resp.StatusCode != 200 || a.body["state"] != tc.state {
				t.Fatalf("got %d %v, want 200 %s", a.resp.StatusCode, a.body, tc.state)
			}
			if lag > 50*time.Millisecond {
				t.Errorf("answered %v after the job became %s, want within 50ms", lag, tc.state)
			}
			if tc.state == "succeeded" {
				if r, _ := a.body["response"].(map[string]any); r == nil || r["body"] != "paid" {
					t.Errorf("response %v, want the upstream's answer", a.body["response"])
				}
			}
			f.untilWaiting(0)
			t.Logf("answered %v after the job became %s", lag, tc.state)
		})
	}
}

// TestLongPollEnds: a wait ends with the job as it is when it runs out,
// at once for a job that is final already or not there (or another
// tenant's), at once for wait=0, when the client leaves, and when the
// server ends its waits (a shutdown).
func TestLongPollEnds(t *testing.T) {
	f := newFixture(t, tokenbucket.Limit{Capacity: 100, Refill: 100, Per: time.Second}, 0)
	_, job := f.do("POST", "/v1/jobs", stripeJob)
	id := job["id"].(string)

	start := time.Now()
	resp, got := f.do("GET", "/v1/jobs/"+id+"?wait=300ms", "")
	if took := time.Since(start); resp.StatusCode != 200 || got["state"] != "queued" || took < 300*time.Millisecond || took > 2*time.Second {
		t.Fatalf("a wait that ran out: got %d %v after %v, want 200 queued after 300ms", resp.StatusCode, got["state"], took)
	}
	for _, tc := range []struct {
		name, path string
		key        string
		status     int
	}{
		{"wait=0", "/v1/jobs/" + id + "?wait=0", "billing-secret", 200},
		{"another tenant's", "/v1/jobs/" + id + "?wait=30s", "ops-secret", 404},
		{"not there", "/v1/jobs/stripe.default.nope?wait=30s", "billing-secret", 404},
	} {
		start := time.Now()
		resp, got := f.do("GET", tc.path, "", "Authorization", "Bearer "+tc.key)
		if took := time.Since(start); resp.StatusCode != tc.status || took > time.Second {
			t.Errorf("%s: got %d %v after %v, want %d at once", tc.name, resp.StatusCode, got, took, tc.status)
		}
	}

	// The client leaves.
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", f.hs.URL+"/v1/jobs/"+id+"?wait=30s", nil)
	req.Header.Set("Authorization", "Bearer billing-secret")
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	f.untilWaiting(1)
	cancel()
	<-done
	f.untilWaiting(0)

	// The server shuts down.
	ch := f.start("GET", "/v1/jobs/"+id+"?wait=30s", "")
	f.untilWaiting(1)
	f.q.EndWaits()
	a := received(t, ch, 2*time.Second)
	if a.resp.StatusCode != 200 || a.body["state"] != "queued" {
		t.Fatalf("after EndWaits: got %d %v, want 200 queued", a.resp.StatusCode, a.body)
	}
	start = time.Now()
	if resp, _ := f.do("GET", "/v1/jobs/"+id+"?wait=30s", ""); resp.StatusCode != 200 || time.Since(start) > time.Second {
		t.Fatalf("a wait after EndWaits: %d after %v, want 200 at once", resp.StatusCode, time.Since(start))
	}

	// Finished already: at once.
	f2 := newFixture(t, tokenbucket.Limit{Capacity: 100, Refill: 100, Per: time.Second}, 0)
	_, job = f2.do("POST", "/v1/jobs", stripeJob)
	newWorker(t, f2).finish(1, jobstore.Succeeded)
	start = time.Now()
	if resp, got := f2.do("GET", "/v1/jobs/"+job["id"].(string)+"?wait=30s", ""); got["state"] != "succeeded" || time.Since(start) > time.Second {
		t.Fatalf("a finished job: %d %v after %v, want succeeded at once", resp.StatusCode, got["state"], time.Since(start))
	}
}

// TestLongPollBadWait: a wait that is not a duration, or over 60s, is a
// 400 naming wait.
func TestLongPollBadWait(t *testing.T) {
	f := newFixture(t, tokenbucket.Limit{Capacity: 100, Refill: 100, Per: time.Second}, 0)
	_, job := f.do("POST", "/v1/jobs", stripeJob)
	for _, v := range []string{"61s", "2m", "soon", "-5s", "120"} {
		resp, got := f.do("GET", "/v1/jobs/"+job["id"].(string)+"?wait="+v, "")
		errs, _ := got["errors"].([]any)
		field := ""
		if len(errs) == 1 {
			field, _ = errs[0].(map[string]any)["field"].(string)
		}
		if resp.StatusCode != 400 || field != "wait" || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("wait=%s: got %d %v, want a 400 problem naming wait", v, resp.StatusCode, got)
		}
	}
}

// TestLongPollCostsRedisNothing: while 200 long polls wait, the server
// sends Redis (almost) no commands: the waiters are woken, not polling.
func TestLongPollCostsRedisNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("a second of waiters counted: runs in make test")
	}
	f := newFixture(t, tokenbucket.Limit{Capacity: 1000, Refill: 1000, Per: time.Second}, 0)
	_, job := f.do("POST", "/v1/jobs", stripeJob)
	const n = 200
	var chs []<-chan answer
	for range n {
		chs = append(chs, f.start("GET", "/v1/jobs/"+job["id"].(string)+"?wait=10s", ""))
	}
	f.untilWaiting(n)
	commands := func() int64 {
		info := f.rdb.Info(context.Background(), "stats").Val()
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "total_commands_processed:"); ok {
				c, _ := strconv.ParseInt(v, 10, 64)
				return c
			}
		}
		t.Fatal("no total_commands_processed in INFO")
		return 0
	}
	// Registered, each waiter reads its job once: let those reads land.
	time.Sleep(time.Second)
	before := commands()
	time.Sleep(time.Second)
	// The INFO itself counts one.
	if d := commands() - before; d > 5 {
		t.Errorf("%d Redis commands in a second of %d waiting long polls, want a handful at most", d, n)
	}
	start := time.Now()
	newWorker(t, f).finish(1, jobstore.Succeeded)
	for _, ch := range chs {
		if a := received(t, ch, 5*time.Second); a.body["state"] != "succeeded" {
			t.Fatalf("got %v, want succeeded", a.body["state"])
		}
	}
	t.Logf("%d long polls answered %v after the finish", n, time.Since(start))
}

// TestPreferWaitEnqueue: Prefer: wait=N on POST /v1/jobs answers 200 with
// the final job and Preference-Applied when it finishes in time, else the
// usual 202.
func TestPreferWaitEnqueue(t *testing.T) {
	f := newFixture(t, tokenbucket.Limit{Capacity: 100, Refill: 100, Per: time.Second}, 0)
	w := newWorker(t, f)
	ch := f.start("POST", "/v1/jobs", stripeJob, "Prefer", "wait=10")
	f.untilWaiting(1)
	w.finish(1, jobstore.Succeeded)
	a := received(t, ch, 5*time.Second)
	if a.resp.StatusCode != 200 || a.body["state"] != "succeeded" || a.resp.Header.Get("Preference-Applied") != "wait=10" {
		t.Fatalf("got %d %v (Preference-Applied %q), want 200 succeeded with Preference-Applied wait=10",
			a.resp.StatusCode, a.body, a.resp.Header.Get("Preference-Applied"))
	}
	if r, _ := a.body["response"].(map[string]any); r == nil || r["body"] != "paid" {
		t.Errorf("response %v, want the upstream's answer", a.body["response"])
	}

	start := time.Now()
	resp, got := f.do("POST", "/v1/jobs", stripeJob, "Prefer", "wait=1")
	if took := time.Since(start); resp.StatusCode != 202 || got["state"] != "queued" || resp.Header.Get("Preference-Applied") != "" ||
		resp.Header.Get("Location") == "" || took < time.Second {
		t.Fatalf("not finished in time: got %d %v (Preference-Applied %q) after %v, want the usual 202 after 1s",
			resp.StatusCode, got, resp.Header.Get("Preference-Applied"), took)
	}
	// A preference the server cannot read is ignored (RFC 7240).
	start = time.Now()
	if resp, _ := f.do("POST", "/v1/jobs", stripeJob, "Prefer", "wait=soon"); resp.StatusCode != 202 || time.Since(start) > 500*time.Millisecond {
		t.Fatalf("Prefer: wait=soon: %d after %v, want 202 at once", resp.StatusCode, time.Since(start))
	}
	// A refused job is answered at once.
	if resp, _ := f.do("POST", "/v1/jobs", `{"upstream":"stripe"}`, "Prefer", "wait=10"); resp.StatusCode != 400 {
		t.Fatalf("an invalid job with Prefer: got %d, want 400", resp.StatusCode)
	}
}

// TestPreferWaitBatch: each stored job of a batch that is final in time is
// answered 200 with its final job; Preference-Applied only when all are.
func TestPreferWaitBatch(t *testing.T) {
	f := newFixture(t, tokenbucket.Limit{Capacity: 100, Refill: 100, Per: time.Second}, 0)
	w := newWorker(t, f)
	batch := `{"jobs":[` + stripeJob + `,` + stripeJob + `,{"upstream":"nope"}]}`
	type result struct {
		Status int            `json:"status"`
		Job    map[string]any `json:"job"`
	}
	results := func(a answer) []result {
		raw, _ := json.Marshal(a.body["results"])
		var out []result
		json.Unmarshal(raw, &out)
		return out
	}

	ch := f.start("POST", "/v1/jobs/batch", batch, "Prefer", "wait=1")
	f.untilWaiting(1)
	w.finish(1, jobstore.Dead)
	a := received(t, ch, 5*time.Second)
	rs := results(a)
	if a.resp.StatusCode != 200 || len(rs) != 3 || rs[0].Status != 200 || rs[0].Job["state"] != "dead" ||
		rs[1].Status != 202 || rs[1].Job["state"] != "queued" || rs[2].Status != 404 || a.resp.Header.Get("Preference-Applied") != "" {
		t.Fatalf("one of two finished: got %d %+v (Preference-Applied %q), want [200 dead, 202 queued, 404] without it",
			a.resp.StatusCode, rs, a.resp.Header.Get("Preference-Applied"))
	}
	w.finish(1, jobstore.Dead)

	ch = f.start("POST", "/v1/jobs/batch", batch, "Prefer", "wait=10")
	f.untilWaiting(1)
	w.finish(2, jobstore.Succeeded)
	a = received(t, ch, 5*time.Second)
	rs = results(a)
	if len(rs) != 3 || rs[0].Status != 200 || rs[0].Job["state"] != "succeeded" || rs[1].Status != 200 ||
		rs[1].Job["state"] != "succeeded" || a.resp.Header.Get("Preference-Applied") != "wait=10" {
		t.Fatalf("both finished: got %+v (Preference-Applied %q), want both 200 succeeded with wait=10",
			rs, a.resp.Header.Get("Preference-Applied"))
	}
}
