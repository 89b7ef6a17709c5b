package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shaperhq/shaper/client"
	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/queue"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startServe runs `shaper serve` on a free port and waits until it is ready.
func (e *env) startServe(env ...string) string {
	e.t.Helper()
	addr := freeAddr(e.t)
	e.startProc(env, "serve", "--config", e.cfg, "--listen", addr, "--log-level", "warn")
	waitUntil(e.t, 30*time.Second, "shaper serve to be ready", func() bool {
		resp, err := e.api.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return "http://" + addr
}

// TestAdmissionIsExactAcrossReplicas: three `shaper serve` processes share
// one Redis with admission capacity 10; 20 requests at once, spread over the
// three, must get exactly 10 answers of 202 and 10 of 429 with Retry-After.
func TestAdmissionIsExactAcrossReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("shaper serve replicas: multi-process, runs in make test")
	}
	t.Parallel()
	e := newEnv(t, fakeupstream.Config{}, redistest.Options{})
	e.writeConfig(`
redis: {url: "{{REDIS}}"}
api:
  keys: [{name: billing, key_env: E2E_KEY}]
  admission: {capacity: 10, refill_per_second: 0.001}
upstreams:
  api:
    base_url: "{{UPSTREAM}}"
    limits: [{rate: 100, per: 1s}]
`)
	var urls []string
	for i := 0; i < 3; i++ {
		urls = append(urls, e.startServe("E2E_KEY=k-e2e"))
	}
	// Warm each replica's connections so the burst is not spread by dialing.
	for _, u := range urls {
		if resp, err := e.api.Get(u + "/readyz"); err == nil {
			resp.Body.Close()
		}
	}
	start := make(chan struct{})
	type answer struct {
		status int
		retry  string
	}
	answers := make([]answer, 20)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", urls[i%3]+"/v1/jobs", strings.NewReader(`{"upstream":"api","path":"/x"}`))
			req.Header.Set("Authorization", "Bearer k-e2e")
			req.Header.Set("Content-Type", "application/json")
			<-start
			resp, err := e.api.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			answers[i] = answer{resp.StatusCode, resp.Header.Get("Retry-After")}
		}()
	}
	close(start)
	wg.Wait()
	counts := map[int]int{}
	for _, a := range answers {
		counts[a.status]++
		if a.status == 429 {
			if n, err := strconv.Atoi(a.retry); err != nil || n < 1 {
				t.Errorf("429 with Retry-After %q, want whole seconds", a.retry)
			}
		}
	}
	if counts[202] != 10 || counts[429] != 10 {
		t.Fatalf("got %v, want exactly 10×202 and 10×429", counts)
	}
	c, err := e.q.Counts(context.Background(), "api")
	if err != nil || c["default"].Pending != 10 {
		t.Fatalf("queued %+v (%v), want the 10 admitted jobs", c, err)
	}
}

// TestStatusDrainRate: under steady load with 2 workers, the drain rate
// `shaper status --json` reports is within 5% of the rate actually sent.
func TestStatusDrainRate(t *testing.T) {
	if testing.Short() {
		t.Skip("measures a drain rate over seconds: multi-process, runs in make test")
	}
	t.Parallel()
	e := newEnv(t, fakeupstream.Config{}, redistest.Options{})
	e.writeConfig(`
redis: {url: "{{REDIS}}"}
upstreams:
  api:
    base_url: "{{UPSTREAM}}"
    limits: [{rate: 40, per: 1s}]
`)
	e.enqueue(1200, func(i int) *queue.Job { return &queue.Job{Upstream: "api", Path: "/s/" + strconv.Itoa(i)} })
	e.startWorker()
	e.startWorker()
	// Let the rate settle over a full 10s window, then ask.
	waitUntil(t, 30*time.Second, "the first delivery", func() bool { return e.fake.Report().Total > 0 })
	time.Sleep(14 * time.Second)
	out, err := exec.Command(shaperBin, "status", "--config", e.cfg, "--json").CombinedOutput()
	if err != nil {
		t.Fatalf("shaper status: %v\n%s", err, out)
	}
	asked := time.Now()
	var got struct {
		Upstreams []struct {
			Name      string `json:"name"`
			DrainRate struct {
				Last10s float64 `json:"last_10s"`
			} `json:"drain_rate"`
			Backlog struct {
				Total int64 `json:"total"`
			} `json:"backlog"`
		} `json:"upstreams"`
	}
	if err := json.Unmarshal(out, &got); err != nil || len(got.Upstreams) != 1 {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	// The actual rate over the same 10 whole seconds status averaged: the
	// ten before the one before the current second.
	end := asked.Truncate(time.Second).Add(-time.Second)
	startWall := end.Add(-10 * time.Second)
	recs := e.fake.Records()
	since := e.fake.Report().Since
	sent := 0
	for _, r := range recs {
		at := since.Add(r.At)
		if !at.Before(startWall) && at.Before(end) {
			sent++
		}
	}
	actual := float64(sent) / 10
	reported := got.Upstreams[0].DrainRate.Last10s
	t.Logf("status says %.2f/s over the last 10s; the upstream received %.2f/s", reported, actual)
	if actual == 0 || reported < actual*0.95 || reported > actual*1.05 {
		t.Fatalf("reported drain rate %.2f/s, actual %.2f/s: more than 5%% apart", reported, actual)
	}
}

// TestDevSmoke: `shaper dev` with no setup; a job enqueued to demo succeeds.
func TestDevSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("runs shaper dev: multi-process, runs in make test")
	}
	t.Parallel()
	addr := freeAddr(t)
	cmd := exec.Command(shaperBin, "dev", "--listen", addr, "--log-level", "warn")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	}()
	// The banner prints the API key and a curl line.
	sc := bufio.NewScanner(stdout)
	key, curl, secret := "", "", ""
	for sc.Scan() && (key == "" || curl == "") {
		line := strings.TrimSpace(sc.Text())
		if k, ok := strings.CutPrefix(line, "API key"); ok {
			key = strings.TrimSpace(k)
		}
		if _, after, ok := strings.Cut(line, "signed with "); ok && strings.HasPrefix(line, "callbacks") {
			secret, _, _ = strings.Cut(after, " ")
		}
		if strings.HasPrefix(line, "curl -s -X POST") {
			curl = line
		}
	}
	go io.Copy(io.Discard, stdout)
	if key == "" || curl == "" {
		t.Fatalf("banner lacks the API key or the curl line; stderr:\n%s", stderr.String())
	}
	// The printed curl line works as printed.
	out, err := exec.Command("sh", "-c", curl).CombinedOutput()
	if err != nil {
		t.Fatalf("the printed curl line failed: %v\n%s", err, out)
	}
	var accepted struct{ ID, State string }
	if err := json.Unmarshal(out, &accepted); err != nil || accepted.ID == "" {
		t.Fatalf("curl printed %s", out)
	}
	c, err := client.New("http://"+addr, key, client.WithHTTPClient(checkedClient(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	job, err := c.Wait(ctx, accepted.ID)
	if err != nil {
		t.Fatalf("waiting for the demo job: %v; stderr:\n%s", err, stderr.String())
	}
	if job.State != client.StateSucceeded || job.Response == nil || job.Response.Status != 200 {
		t.Fatalf("demo job: %+v", job)
	}

	// A callback to this machine arrives, signed with the printed secret
	// (checked by the standardwebhooks npm package).
	if secret == "" {
		t.Fatalf("banner prints no callback secret; stderr:\n%s", stderr.String())
	}
	hooks := newHookReceiver(t)
	withHook, err := c.Enqueue(ctx, client.JobRequest{Upstream: "demo", Method: "POST", Path: "/v1/hello",
		CallbackURL: hooks.hs.URL + "/hook/1"})
	if err != nil {
		t.Fatal(err)
	}
	for hooks.count() == 0 && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
	}
	ds := hooks.deliveries()
	if len(ds) == 0 {
		t.Fatalf("no callback for %s within the deadline; stderr:\n%s", withHook.ID, stderr.String())
	}
	for i := range ds {
		ds[i].Secret = secret
	}
	if ok, failed := verifyWebhooks(t, ds[:1]); ok != 1 || !strings.Contains(ds[0].Body, withHook.ID) {
		t.Fatalf("dev's callback: verified %d, failures %v, body %s", ok, failed, ds[0].Body)
	}
}
