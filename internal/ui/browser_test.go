package ui_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/server"
	"github.com/shaperhq/shaper/status"
	"github.com/shaperhq/shaper/tokenbucket"
)

var srv *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &srv) }

// browser drives a headless Chromium over the DevTools protocol on a pipe
// (--remote-debugging-pipe: commands in on its fd 3, answers out on fd 4,
// each message ended by a NUL), one command at a time, so the test needs
// no WebSocket and no dependency.
type browser struct {
	t       *testing.T
	cmd     *exec.Cmd
	in      io.WriteCloser
	out     *bufio.Reader
	next    int
	session string
}

func startBrowser(t *testing.T) *browser {
	t.Helper()
	var path string
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		t.Fatal("chromium is not installed: scripts/test.sh installs Debian's chromium package (apt-get install -y chromium); go test -short skips this test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	cmdR, cmdW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, path, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--user-data-dir="+t.TempDir(), "--remote-debugging-pipe", "about:blank")
	cmd.ExtraFiles = []*os.File{cmdR, outW} // fds 3 and 4
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The child holds its own copies; closing ours lets a read see the
	// browser's end.
	cmdR.Close()
	outW.Close()
	b := &browser{t: t, cmd: cmd, in: cmdW, out: bufio.NewReader(outR)}
	t.Cleanup(func() {
		cmdW.Close()
		cmd.Process.Kill()
		cmd.Wait()
		outR.Close()
		cancel()
		if t.Failed() {
			t.Logf("chromium's stderr:\n%s", lastLines(stderr.String(), 20))
		}
	})
	var target struct {
		TargetID string `json:"targetId"`
	}
	b.call("Target.createTarget", map[string]any{"url": "about:blank"}, &target)
	var attached struct {
		SessionID string `json:"sessionId"`
	}
	b.call("Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &attached)
	b.session = attached.SessionID
	return b
}

// call sends one command and decodes its result into v (when not nil),
// passing over the events that arrive before it.
func (b *browser) call(method string, params any, v any) {
	b.t.Helper()
	b.next++
	msg := map[string]any{"id": b.next, "method": method, "params": params}
	if b.session != "" {
		msg["sessionId"] = b.session
	}
	raw, _ := json.Marshal(msg)
	if _, err := b.in.Write(append(raw, 0)); err != nil {
		b.t.Fatalf("%s: %v", method, err)
	}
	for {
		line, err := b.out.ReadBytes(0)
		if err != nil {
			b.t.Fatalf("%s: reading chromium's answer: %v", method, err)
		}
		var res struct {
			ID     int             `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(line[:len(line)-1], &res); err != nil {
			b.t.Fatalf("%s: %v in %s", method, err, line)
		}
		if res.ID != b.next {
			continue // an event, or nothing we wait for
		}
		if res.Error != nil {
			b.t.Fatalf("%s: %s", method, res.Error.Message)
		}
		if v != nil {
			if err := json.Unmarshal(res.Result, v); err != nil {
				b.t.Fatalf("%s: %v in %s", method, err, res.Result)
			}
		}
		return
	}
}

// eval runs a JavaScript expression in the page and returns its value.
func (b *browser) eval(expr string) any {
	b.t.Helper()
	var res struct {
		Result struct {
			Value any `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	b.call("Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true, "awaitPromise": true}, &res)
	if e := res.ExceptionDetails; e != nil {
		b.t.Fatalf("%s: %s %s", expr, e.Text, e.Exception.Description)
	}
	return res.Result.Value
}

func (b *browser) text(selector string) string {
	b.t.Helper()
	v := b.eval(fmt.Sprintf(`(document.querySelector(%q) || {}).textContent || ""`, selector))
	s, _ := v.(string)
	return s
}

// waitFor waits, in real time, until the expression is true in the page.
func (b *browser) waitFor(what, expr string, within time.Duration) {
	b.t.Helper()
	deadline := time.Now().Add(within)
	for b.eval(expr) != true {
		if time.Now().After(deadline) {
			b.t.Fatalf("after %v, %s is not so (%s); page:\n%s", within, what, expr, b.eval(`document.body.innerText`))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (b *browser) open(url string) {
	b.t.Helper()
	b.call("Page.navigate", map[string]any{"url": url}, nil)
}

// lastLines is the end of chromium's log, less its complaints that the
// machine has no D-Bus, which it has not in a container.
func lastLines(s string, n int) string {
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if !strings.Contains(l, "dbus") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// seen is what the server was asked.
type seen struct {
	mu   sync.Mutex
	reqs []string // "METHOD PATH?QUERY AUTHORIZATION"
}

func (s *seen) add(r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get("Authorization"))
}

func (s *seen) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.reqs...)
}

// TestPageInChromium drives the status page in a real headless Chromium
// against the real API on a real Redis, as a user would: the key from the
// fragment, the upstream shown, Pause refused to a key that is not an
// admin's and then done and undone with an admin's, and the dead jobs
// listed and retried. The job listing and retry are served here as
// issue 10's contract describes them (GET /v1/jobs, POST
// /v1/jobs/{id}/retry), and then taken away, as on a server without them.
func TestPageInChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("drives a headless Chromium; runs in make test")
	}
	began := time.Now()
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	ups := []shaper.Upstream{{Name: "mail", BaseURL: "https://mail.example.com", Limits: []leaky.Limit{leaky.PerSecond(10)},
		Lanes: map[string]int{"default": 1, "bulk": 1}, Retry: shaper.Retry{MaxAttempts: 3}}}
	q, err := queue.New(rdb, queue.Config{Upstreams: ups})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	st, err := status.NewReader(rdb, q, "")
	if err != nil {
		t.Fatal(err)
	}
	api, err := server.New(rdb, q, st, server.Config{
		Keys: []server.Key{
			{Name: "viewer", Tenant: "acme", Secret: "view-secret"},
			{Name: "ops", Tenant: "acme", Secret: "admin-secret", Admin: true},
		},
		Admission: tokenbucket.Limit{Capacity: 1000, Refill: 1000, Per: time.Second},
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	// The contract's job listing, with two dead jobs until one is retried.
	var mu sync.Mutex
	dead := []server.JobView{
		{ID: "mail.default.acme.dead2", Tenant: "acme", Upstream: "mail", Lane: "default", State: queue.StateDead, Attempts: 3, MaxAttempts: 3,
			LastError: "upstream answered 500", CreatedAt: time.Now().Add(-time.Minute)},
		{ID: "mail.bulk.acme.dead1", Tenant: "acme", Upstream: "mail", Lane: "bulk", Partition: "example.org", State: queue.StateDead, Attempts: 3,
			MaxAttempts: 3, LastError: "upstream answered 400: <b>bad</b>", CreatedAt: time.Now().Add(-2 * time.Minute)},
	}
	jobsMissing := false
	var asked seen
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/jobs", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if jobsMissing {
			// What a server from before the listing answers: its mux
			// knew the path only for POST.
			w.Header().Set("Allow", "POST")
			http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
			return
		}
		if r.Header.Get("Authorization") != "Bearer view-secret" && r.Header.Get("Authorization") != "Bearer admin-secret" {
			api.Handler().ServeHTTP(w, r) // what the server answers to a bad key
			return
		}
		if q := r.URL.Query(); q.Get("upstream") != "mail" || q.Get("state") != "dead" || q.Get("limit") != "20" {
			http.Error(w, "unexpected query "+r.URL.RawQuery, http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"jobs": dead, "next_cursor": ""})
	})
	var retried []string
	mux.HandleFunc("POST /v1/jobs/{id}/retry", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		for i, j := range dead {
			if j.ID == r.PathValue("id") {
				retried = append(retried, j.ID)
				dead = append(dead[:i:i], dead[i+1:]...)
				j.State, j.Attempts = queue.StateQueued, 0
				w.Header().Set("Content-Type", "application/json")
				json.NewEncoder(w).Encode(j)
				return
			}
		}
		http.Error(w, "no such job", http.StatusNotFound)
	})
	mux.Handle("/", api.Handler())
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.add(r)
		mux.ServeHTTP(w, r)
	}))
	defer hs.Close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	// Backlog in both lanes, for the table; no worker drains it.
	for i, lane := range []string{"default", "default", "bulk"} {
		req, _ := http.NewRequest("POST", hs.URL+"/v1/jobs", strings.NewReader(fmt.Sprintf(`{"upstream":"mail","lane":%q,"path":"/send/%d"}`, lane, i)))
		req.Header.Set("Authorization", "Bearer view-secret")
		req.Header.Set("Content-Type", "application/json")
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusAccepted {
			t.Fatalf("enqueue: got %d, want 202", res.StatusCode)
		}
	}

	// A schedule, for the schedules table.
	sreq, _ := http.NewRequest("POST", hs.URL+"/v1/schedules", strings.NewReader(`{"name":"nightly","cron":"30 2 * * *","timezone":"Europe/Berlin","job":{"upstream":"mail","path":"/digest"}}`))
	sreq.Header.Set("Authorization", "Bearer view-secret")
	sreq.Header.Set("Content-Type", "application/json")
	if res, err := client.Do(sreq); err != nil || res.StatusCode != http.StatusCreated {
		t.Fatalf("create schedule: %v %v", res, err)
	} else {
		res.Body.Close()
	}

	// Ten minutes of drain at 4/s, ending two minutes ago: the history the
	// chart must open with.
	rec := jobstore.NewRecorder(rdb, "")
	for sec := 2 * 60; sec < 12*60; sec++ {
		for range 4 {
			rec.Sent("mail", time.Now().Add(-time.Duration(sec)*time.Second))
		}
	}
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	b := startBrowser(t)
	started := time.Now()
	// What the chart holds the first time it is drawn, before anything
	// else runs: a MutationObserver's callback comes right after the task
	// that drew it, before the page could poll again.
	b.call("Page.enable", map[string]any{}, nil)
	b.call("Page.addScriptToEvaluateOnNewDocument", map[string]any{"source": `
		window.firstChart = null;
		new MutationObserver(() => {
			const line = document.querySelector('[data-upstream="mail"] svg.chart polyline.drain');
			if (window.firstChart === null && line) {
				window.firstChart = {
					points: (line.getAttribute("points") || "").trim().split(/\s+/).filter(Boolean).length,
					caption: document.querySelector('[data-upstream="mail"] [data-field="chart_caption"]').textContent,
				};
			}
		}).observe(document, { childList: true, subtree: true, characterData: true });`}, nil)

	// A viewer's key, from the fragment.
	b.open(hs.URL + "/ui/#key=view-secret")
	b.waitFor("the mail upstream shown", `!!document.querySelector('[data-upstream="mail"] [data-field="backlog"]') && document.querySelector('[data-upstream="mail"] [data-field="backlog"]').textContent === "3"`, 10*time.Second)
	if got := b.eval(`location.href`); got != hs.URL+"/ui/" {
		t.Errorf("address bar: got %v, want %s/ui/ (the key taken out of it)", got, hs.URL)
	}
	if got := b.eval(`sessionStorage.getItem("shaper.apiKey")`); got != "view-secret" {
		t.Errorf("sessionStorage: got %v, want the key", got)
	}
	if got := b.text(`[data-upstream="mail"] [data-field="limit"]`); got != "10/s" {
		t.Errorf("limit: got %q, want 10/s", got)
	}
	if got := b.text(`[data-upstream="mail"] [data-field="callbacks_failed"]`); got != "0" {
		t.Errorf("failing callbacks: got %q, want 0", got)
	}
	rows := b.eval(`Array.from(document.querySelectorAll('[data-upstream="mail"] [data-field="lanes"] tbody tr')).map(tr => tr.innerText.replace(/\s+/g, " "))`)
	if fmt.Sprint(rows) != "[bulk 1 0 0 0 1 0 0 default 2 0 0 0 2 0 0]" {
		t.Errorf("lanes table: got %v, want bulk with 1 queued and default with 2", rows)
	}
	if got := b.text(`[data-upstream="mail"] [data-field="chart_caption"]`); !strings.Contains(got, "drain rate now 0/s") || !strings.Contains(got, "limit 10/s") {
		t.Errorf("chart caption: got %q, want the drain rate and the limit in words", got)
	}
	// The first paint already has the 15 minutes Redis keeps (90 steps
	// of 10 s, and the first reading), with the 4/s peak.
	first, _ := b.eval(`window.firstChart`).(map[string]any)
	if n, _ := first["points"].(float64); n < 85 {
		t.Errorf("the chart's first paint: got %v points, want the history's 90 and the first reading (%v)", first["points"], first)
	}
	if c, _ := first["caption"].(string); !strings.Contains(c, "over the last 1") || !strings.Contains(c, "from the drain counts the workers keep") || !strings.Contains(c, "peak 4/s") {
		t.Errorf("the chart's first caption: got %q, want 15 minutes from the drain counts, peak 4/s", c)
	}

	// The dead jobs, listed as data (never as markup), and one retried.
	b.waitFor("the schedule listed", `!!document.querySelector('[data-schedule="nightly"]') && !document.getElementById("schedules").hidden && document.querySelector('[data-schedule="nightly"]').innerText.includes("30 2 * * * (Europe/Berlin)")`, 10*time.Second)
	b.waitFor("two dead jobs listed", `document.querySelectorAll('[data-field="dead_jobs"] tbody tr').length === 2`, 10*time.Second)
	if got := b.eval(`document.querySelectorAll('[data-field="dead_jobs"] b').length`); got != 0.0 {
		t.Errorf("a last_error became markup: got %v <b> elements, want 0", got)
	}
	b.eval(`document.querySelector('button[aria-label="Retry job mail.bulk.acme.dead1"]').click()`)
	b.waitFor("the retry confirmed", `document.querySelector('[data-upstream="mail"]').innerText.includes("Job mail.bulk.acme.dead1 is queued again.")`, 10*time.Second)
	b.waitFor("the retried job gone from the list", `document.querySelectorAll('[data-field="dead_jobs"] tbody tr').length === 1`, 10*time.Second)
	mu.Lock()
	if fmt.Sprint(retried) != "[mail.bulk.acme.dead1]" {
		t.Errorf("retried: got %v, want [mail.bulk.acme.dead1]", retried)
	}
	mu.Unlock()

	// Pause: the API refuses a viewer; the page turns the buttons off and says why.
	b.eval(`document.querySelector('[data-upstream="mail"] .pause button').click()`)
	b.waitFor("pause refused", `document.querySelector('[data-upstream="mail"] .pause .note').textContent.includes("not an admin key")`, 10*time.Second)
	if b.eval(`document.querySelector('[data-upstream="mail"] .pause button').disabled`) != true {
		t.Error("after a 403, Pause is still enabled")
	}
	if u, _ := st.Upstream(ctx, "mail"); u.PausedUntil != nil {
		t.Errorf("a viewer's Pause paused the upstream until %v", u.PausedUntil)
	}

	// An admin's key pauses and resumes. Opened in the same tab, only the
	// fragment changes: the page takes the new key without a reload.
	b.open(hs.URL + "/ui/#key=admin-secret")
	b.waitFor("the page read with the admin key", `!!document.querySelector('[data-upstream="mail"] .pause button') && !document.querySelector('[data-upstream="mail"] .pause button').disabled`, 10*time.Second)
	b.eval(`document.querySelector('[data-upstream="mail"] .pause button').click()`)
	b.waitFor("shown paused", `document.querySelector('[data-upstream="mail"] .badge').textContent === "paused"`, 10*time.Second)
	if got := b.text(`[data-upstream="mail"] [data-field="pause_state"]`); !strings.HasPrefix(got, "Paused until ") || !strings.Contains(got, "(paused by ops)") {
		t.Errorf("pause state: got %q, want paused until a time, by ops", got)
	}
	if u, _ := st.Upstream(ctx, "mail"); u.PausedUntil == nil || time.Until(*u.PausedUntil) > 31*time.Second {
		t.Errorf("after Pause (for 30 s): got paused until %v, want about 30 s from now", u.PausedUntil)
	}
	b.eval(`[...document.querySelectorAll('[data-upstream="mail"] .pause button')].find(b => b.textContent === "Resume").click()`)
	b.waitFor("shown running", `document.querySelector('[data-upstream="mail"] .badge').textContent === "running"`, 10*time.Second)
	if u, _ := st.Upstream(ctx, "mail"); u.PausedUntil != nil {
		t.Errorf("after Resume: still paused until %v", u.PausedUntil)
	}

	// A server without the job listing: said so, not an error.
	mu.Lock()
	jobsMissing = true
	mu.Unlock()
	b.call("Page.reload", map[string]any{}, nil)
	b.waitFor("the listing said missing", `(document.querySelector('[data-field="dead_status"]') || {}).textContent === "Job listing not available on this server: it does not answer GET /v1/jobs. The count above is all it reports."`, 10*time.Second)

	// Forgetting the key asks for one.
	b.eval(`document.getElementById("forget").click()`)
	b.waitFor("the key form shown", `!document.getElementById("login").hidden && sessionStorage.getItem("shaper.apiKey") === null && !document.querySelector("[data-upstream]")`, 5*time.Second)

	// The server saw no key but on API calls, and the fragment never.
	for _, r := range asked.all() {
		method, rest, _ := strings.Cut(r, " ")
		path, auth, _ := strings.Cut(rest, " ")
		switch {
		case strings.Contains(path, "secret"):
			t.Errorf("a request carried the key in its address: %s %s", method, path)
		case strings.HasPrefix(path, "/ui") && auth != "":
			t.Errorf("%s %s carried Authorization %q; the page's files need none", method, path, auth)
		case strings.HasPrefix(path, "/v1/") && auth != "Bearer view-secret" && auth != "Bearer admin-secret":
			t.Errorf("%s %s carried Authorization %q, want the key as a bearer token", method, path, auth)
		}
	}
	t.Logf("the browser part took %v; the whole test %v", time.Since(started).Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}
