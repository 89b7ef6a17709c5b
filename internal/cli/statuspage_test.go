package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper/internal/testsupport"
)

// chromium is the path of Debian's chromium; the full run fails without
// it, since scripts/test.sh installs it.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium is not installed: scripts/test.sh installs Debian's chromium package (apt-get install -y chromium); go test -short skips this test")
	return ""
}

// renderPage loads url in a headless Chromium and returns the DOM as the
// page's script left it after budget of virtual time, in which the page
// polls the API every 2 s (virtual time waits for those requests).
func renderPage(t *testing.T, browser, url string, budget time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser, "--headless=new", "--no-sandbox", "--disable-gpu",
		"--disable-dev-shm-usage", "--no-first-run", "--user-data-dir="+t.TempDir(),
		"--virtual-time-budget="+strconv.FormatInt(budget.Milliseconds(), 10), "--dump-dom", url)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", browser, err, stderr.String())
	}
	return stdout.String()
}

// TestStatusPageInChromium runs `shaper dev` on a real Redis, enqueues
// jobs to its demo upstream, waits until the workers drain them against
// the fake upstream, then opens the link dev printed in a real headless
// Chromium: the rendered page must show the demo upstream and a drain rate
// above zero, which only the page's script, reading the API with the key
// from the link's fragment, can have written.
func TestStatusPageInChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("starts shaper dev and a headless Chromium; runs in make test")
	}
	browser := chromium(t)
	began := time.Now()
	rdb := srv.Client(t)
	rdb.FlushAll(context.Background())

	ctx, cancel := context.WithCancel(context.Background())
	out := &testsupport.LockedBuffer{}
	errOut := &testsupport.LockedBuffer{}
	f := &Factory{In: strings.NewReader(""), Out: out, ErrOut: errOut, LookupEnv: func(string) (string, bool) { return "", false }}
	done := make(chan int, 1)
	go func() {
		done <- f.execute(ctx, []string{"dev", "--listen", "127.0.0.1:0", "--redis", srv.URL(), "--api-key", "ui-key", "--log-level", "warn"})
	}()
	defer func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("shaper dev: exit %d: %s", code, errOut.String())
			}
		case <-time.After(30 * time.Second):
			t.Errorf("shaper dev did not stop within 30s of its context ending")
		}
	}()

	// The banner links the status page with the key in its fragment.
	link := regexp.MustCompile(`status +(http://127\.0\.0\.1:[0-9]+)/ui/#key=ui-key `)
	var base string
	for deadline := time.Now().Add(20 * time.Second); base == ""; time.Sleep(20 * time.Millisecond) {
		if m := link.FindStringSubmatch(out.String()); m != nil {
			base = m[1]
		}
		select {
		case code := <-done:
			t.Fatalf("shaper dev ended with exit %d before printing the status link: %s", code, errOut.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no status page link in dev's banner after 20s:\n%s", out.String())
		}
	}

	client := &http.Client{Transport: &http.Transport{}, Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	call := func(method, path, body string) []byte {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer ui-key")
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		raw, _ := io.ReadAll(res.Body)
		if res.StatusCode >= 300 {
			t.Fatalf("%s %s: got %d, want 2xx: %s", method, path, res.StatusCode, raw)
		}
		return raw
	}
	// Enough jobs to keep the demo's 5/s busy for the whole test.
	for i := 0; i < 60; i++ {
		call("POST", "/v1/jobs", fmt.Sprintf(`{"upstream":"demo","path":"/v1/items/%d"}`, i))
	}
	// The API's drain rate counts complete seconds only: wait until it
	// shows the workers' sends, so the page has a rate to show.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var st struct {
			DrainRate struct {
				Last10s float64 `json:"last_10s"`
			} `json:"drain_rate"`
		}
		if err := json.Unmarshal(call("GET", "/v1/upstreams/demo", ""), &st); err != nil {
			t.Fatal(err)
		}
		if st.DrainRate.Last10s > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the API reports no drain of demo 20s after 60 jobs were enqueued")
		}
	}

	rendered := time.Now()
	dom := renderPage(t, browser, base+"/ui/#key=ui-key", 5*time.Second)
	took := time.Since(rendered)
	if !strings.Contains(dom, `<section class="upstream" aria-labelledby="u1-h" data-upstream="demo">`) ||
		!strings.Contains(dom, `<span data-field="name">demo</span>`) {
		t.Fatalf("the rendered page does not show the demo upstream:\n%s", dom)
	}
	m := regexp.MustCompile(`<dd data-field="drain_rate">([0-9.]+)/s</dd>`).FindStringSubmatch(dom)
	if m == nil {
		t.Fatalf("the rendered page shows no drain rate:\n%s", dom)
	}
	if rate, _ := strconv.ParseFloat(m[1], 64); rate <= 0 {
		t.Errorf("rendered drain rate: got %s/s, want above 0", m[1])
	}
	for _, want := range []string{
		`<p id="connection" role="status" aria-live="polite">Live: read every 2 s.</p>`,
		`<section id="login" hidden="" aria-labelledby="login-heading">`,
		`<dd data-field="limit" title="5 requests per 1s">5/s</dd>`,
		`<th scope="row">default</th>`,
		`data-field="chart_caption">Requests per second over the`,
		`<polyline class="drain" points="`,
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("the rendered page lacks %s:\n%s", want, dom)
		}
	}
	// With or without the job listing on this server, the page says which.
	dead := regexp.MustCompile(`data-field="dead_status">([^<]*)<`).FindStringSubmatch(dom)
	// dev serves the job listing: the page read it (GET /v1/jobs) and the
	// demo's jobs all succeed.
	if dead == nil || !strings.HasPrefix(dead[1], "No dead jobs") {
		t.Errorf("dead jobs: got %q, want the listing read from the server: none dead", dead)
	}

	// Without a key the page asks for one and reads nothing.
	dom = renderPage(t, browser, base+"/ui/", time.Second)
	if !strings.Contains(dom, `<section id="login" aria-labelledby="login-heading">`) || strings.Contains(dom, `data-upstream=`) {
		t.Errorf("without a key: want the key form shown and no upstream read:\n%s", dom)
	}
	t.Logf("chromium rendered the page in %v; the whole test took %v", took.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}
