package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/queue"
)

// hookReceiver is a callback receiver: it records every delivery and
// answers 503 to the first attempt of every fourth job (by the n in its
// /hook/n path), 204 otherwise, after a pause that leaves deliveries in
// flight for a kill to land on.
type hookReceiver struct {
	hs *httptest.Server
	mu sync.Mutex
	// got are the deliveries, in arrival order.
	got   []hookDelivery
	tries map[string]int // path -> attempts seen
}

type hookDelivery struct {
	Path    string            `json:"-"`
	Status  int               `json:"-"`
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
	Secret  string            `json:"secret"`
}

func newHookReceiver(t *testing.T) *hookReceiver {
	t.Helper()
	h := &hookReceiver{tries: map[string]int{}}
	h.hs = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		time.Sleep(100 * time.Millisecond)
		h.mu.Lock()
		h.tries[r.URL.Path]++
		n, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/hook/"))
		status := http.StatusNoContent
		if n%4 == 0 && h.tries[r.URL.Path] == 1 {
			status = http.StatusServiceUnavailable
		}
		h.got = append(h.got, hookDelivery{Path: r.URL.Path, Status: status, Body: string(body), Headers: map[string]string{
			"webhook-id": r.Header.Get("webhook-id"), "webhook-timestamp": r.Header.Get("webhook-timestamp"),
			"webhook-signature": r.Header.Get("webhook-signature")}})
		h.mu.Unlock()
		w.WriteHeader(status)
	}))
	t.Cleanup(h.hs.Close)
	return h
}

func (h *hookReceiver) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.got)
}

func (h *hookReceiver) deliveries() []hookDelivery {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]hookDelivery(nil), h.got...)
}

func newWebhookSecret(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	rand.Read(b)
	return "whsec_" + base64.StdEncoding.EncodeToString(b)
}

// verifyWebhooks runs the standardwebhooks npm package's verifier over ds
// and returns how many verified and the failures.
func verifyWebhooks(t *testing.T, ds []hookDelivery) (int, []string) {
	t.Helper()
	in, err := json.Marshal(ds)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", "verify-webhooks.mjs")
	cmd.Dir = "node"
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node verify-webhooks.mjs: %v\n%s(is e2e/node/node_modules installed? scripts/test.sh runs npm ci there)", err, stderr.String())
	}
	var res struct {
		Verified int `json:"verified"`
		Failed   []struct {
			Index int    `json:"index"`
			Error string `json:"error"`
		} `json:"failed"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("verifier output %q: %v", out, err)
	}
	var failed []string
	for _, f := range res.Failed {
		failed = append(failed, fmt.Sprintf("%s: %s", ds[f.Index].Path, f.Error))
	}
	return res.Verified, failed
}

// TestCallbacksSurviveCrashes: jobs with a callback_url, enqueued through
// `shaper serve` with two API keys (one with its own callback secret), are
// drained by workers while one is killed with SIGKILL mid-delivery and Redis
// (AOF on) is restarted. Every job's callback must arrive with a 2xx, every
// attempt of one job under the same webhook-id, and every delivery must
// verify with the standardwebhooks npm package under its key's secret.
func TestCallbacksSurviveCrashes(t *testing.T) {
	if testing.Short() {
		t.Skip("kills shaper work processes and restarts Redis: multi-process, runs in make test")
	}
	t.Parallel()
	e := newEnv(t, fakeupstream.Config{}, redistest.Options{AppendOnly: true})
	hooks := newHookReceiver(t)
	hookHost := strings.TrimPrefix(hooks.hs.URL, "http://")
	e.writeConfig(`
redis: {url: "{{REDIS}}"}
work: {shutdown_timeout: 5s}
api:
  keys:
    - {name: billing, key_env: E2E_KEY}
    - {name: partner, key_env: E2E_KEY_PARTNER, callback_secret_env: E2E_HOOK_SECRET_PARTNER}
upstreams:
  api:
    base_url: "{{UPSTREAM}}"
    limits: [{rate: 100, per: 1s}]
callbacks:
  allowed_hosts: ["` + hookHost + `"]
  secret_env: E2E_HOOK_SECRET
  limits: [{rate: 200, per: 1s}]
  retry: {max_attempts: 30, min_backoff: 100ms, max_backoff: 1s}
`)
	secret, partnerSecret := newWebhookSecret(t), newWebhookSecret(t)
	environ := []string{"E2E_KEY=k-billing", "E2E_KEY_PARTNER=k-partner", "E2E_HOOK_SECRET=" + secret, "E2E_HOOK_SECRET_PARTNER=" + partnerSecret}
	api := e.startServe(environ...)
	post := func(key, path, body string) map[string]any {
		t.Helper()
		req, _ := http.NewRequest("POST", api+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := e.api.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		json.NewDecoder(resp.Body).Decode(&out)
		if resp.StatusCode/100 != 2 {
			t.Fatalf("POST %s: %d %v", path, resp.StatusCode, out)
		}
		return out
	}
	// A refused callback_url first: a host not allowed.
	req, _ := http.NewRequest("POST", api+"/v1/jobs", strings.NewReader(`{"upstream":"api","path":"/x","callback_url":"http://127.0.0.1:1/hook"}`))
	req.Header.Set("Authorization", "Bearer k-billing")
	req.Header.Set("Content-Type", "application/json")
	if resp, err := e.api.Do(req); err != nil || resp.StatusCode != 400 {
		t.Fatalf("a callback_url to a host not allowed: got %v %v, want 400", resp, err)
	}

	const perKey = 60
	secretOf := map[string]string{} // job id -> the secret its deliveries carry
	var ids []string
	for k, key := range []string{"k-billing", "k-partner"} {
		var jobs []string
		for i := range perKey {
			n := k*perKey + i
			jobs = append(jobs, fmt.Sprintf(`{"upstream":"api","path":"/c/%d","callback_url":"%s/hook/%d"}`, n, hooks.hs.URL, n))
		}
		res := post(key, "/v1/jobs/batch", `{"jobs":[`+strings.Join(jobs, ",")+`]}`)
		rs, _ := res["results"].([]any)
		if len(rs) != perKey {
			t.Fatalf("batch: got %v", res)
		}
		for _, r := range rs {
			job, _ := r.(map[string]any)["job"].(map[string]any)
			id, _ := job["id"].(string)
			if id == "" {
				t.Fatalf("batch result %v has no job", r)
			}
			ids = append(ids, id)
			secretOf[id] = []string{secret, partnerSecret}[k]
		}
		// And jobs cancelled before they run: cancelled is final too.
		for i := range 5 {
			n := 1000 + k*10 + i
			nb := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
			job := post(key, "/v1/jobs", fmt.Sprintf(`{"upstream":"api","path":"/later","not_before":"%s","callback_url":"%s/hook/%d"}`, nb, hooks.hs.URL, n))
			id := job["id"].(string)
			dreq, _ := http.NewRequest("DELETE", api+"/v1/jobs/"+id, nil)
			dreq.Header.Set("Authorization", "Bearer "+key)
			if resp, err := e.api.Do(dreq); err != nil || resp.StatusCode != 200 {
				t.Fatalf("cancel %s: %v %v", id, resp, err)
			}
			ids = append(ids, id)
			secretOf[id] = []string{secret, partnerSecret}[k]
		}
	}

	victim := e.startProc(environ, "work", "--config", e.cfg, "--metrics-listen", "off", "--log-level", "warn")
	e.startProc(environ, "work", "--config", e.cfg, "--metrics-listen", "off", "--log-level", "warn")
	waitUntil(t, 60*time.Second, "25 callback deliveries", func() bool { return hooks.count() >= 25 })
	victim.kill()
	t.Logf("killed a worker after %d deliveries", hooks.count())
	e.startProc(environ, "work", "--config", e.cfg, "--metrics-listen", "off", "--log-level", "warn")
	waitUntil(t, 60*time.Second, "80 callback deliveries", func() bool { return hooks.count() >= 80 })
	if err := e.redis.Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if err := e.redis.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("restarted Redis after %d deliveries", hooks.count())

	// Every job's callback delivered, as the job shows it.
	deadline := time.Now().Add(3 * time.Minute)
	pending := map[string]bool{}
	for _, id := range ids {
		pending[id] = true
	}
	for len(pending) > 0 {
		for id := range pending {
			info, err := e.q.Get(context.Background(), id, "")
			if err == nil && info.Callback != nil && info.Callback.State == "delivered" {
				delete(pending, id)
			}
		}
		if time.Now().After(deadline) {
			e.mu.Lock()
			for i, w := range e.workers {
				t.Logf("process %d log:\n%s", i, w.log)
			}
			e.mu.Unlock()
			t.Fatalf("after 3m, %d of %d callbacks are not delivered", len(pending), len(ids))
		}
		time.Sleep(100 * time.Millisecond)
	}

	got := hooks.deliveries()
	byPath := map[string][]hookDelivery{}
	for _, d := range got {
		byPath[d.Path] = append(byPath[d.Path], d)
	}
	lost, dups := 0, 0
	for i := range got {
		var view struct {
			ID    string      `json:"id"`
			State queue.State `json:"state"`
		}
		if err := json.Unmarshal([]byte(got[i].Body), &view); err != nil {
			t.Fatalf("delivery %s: body %q: %v", got[i].Path, got[i].Body, err)
		}
		got[i].Secret = secretOf[view.ID]
		if want := "msg_" + view.ID + "_1"; got[i].Headers["webhook-id"] != want {
			t.Errorf("delivery %s: webhook-id %q, want %q", got[i].Path, got[i].Headers["webhook-id"], want)
		}
		if view.State != queue.StateSucceeded && view.State != queue.StateCancelled {
			t.Errorf("delivery %s: job %s is %s, want a final view", got[i].Path, view.ID, view.State)
		}
	}
	for _, id := range ids {
		info, err := e.q.Get(context.Background(), id, "")
		if err != nil {
			t.Fatal(err)
		}
		u, _ := url.Parse(info.CallbackURL)
		ok := 0
		for _, d := range byPath[u.Path] {
			if d.Status/100 == 2 {
				ok++
			}
		}
		switch {
		case ok == 0:
			lost++
			t.Errorf("job %s (%s): its callback never got a 2xx", id, u.Path)
		case ok > 1:
			dups++
		}
	}
	t.Logf("%d jobs, %d deliveries (with retries), %d lost, %d delivered twice or more", len(ids), len(got), lost, dups)

	verified, failed := verifyWebhooks(t, got)
	if verified != len(got) || len(failed) > 0 {
		t.Errorf("standardwebhooks verified %d of %d deliveries; failures: %v", verified, len(got), failed)
	}
	// The verifier can fail: under the other key's secret, none verifies.
	swapped := append([]hookDelivery(nil), got...)
	for i := range swapped {
		if swapped[i].Secret == secret {
			swapped[i].Secret = partnerSecret
		} else {
			swapped[i].Secret = secret
		}
	}
	if verified, _ := verifyWebhooks(t, swapped); verified != 0 {
		t.Errorf("under the wrong secrets %d deliveries verified, want 0", verified)
	}

	// The API shows the delivered callback (checked against the OpenAPI
	// document by e.api).
	greq, _ := http.NewRequest("GET", api+"/v1/jobs/"+ids[0], nil)
	greq.Header.Set("Authorization", "Bearer k-billing")
	resp, err := e.api.Do(greq)
	if err != nil {
		t.Fatal(err)
	}
	var view map[string]any
	json.NewDecoder(resp.Body).Decode(&view)
	resp.Body.Close()
	if cb, _ := view["callback"].(map[string]any); cb["state"] != "delivered" {
		t.Errorf("GET %s: callback %v, want delivered", ids[0], view["callback"])
	}
}
