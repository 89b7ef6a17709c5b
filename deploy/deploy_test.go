// Package deploy holds no code: it tests what deploy/ ships for running
// shaper against the real thing. Promtool checks the Prometheus alert
// rules, and every metric a rule or a Grafana panel queries must be
// exported by a running `shaper serve` or `shaper work`; every shipped
// config passes `shaper config validate`; the compose stack's commands are
// checked against the real command tree and run (compose_test.go); the
// Kubernetes Deployments' processes answer their probes (kubernetes_test.go;
// the manifests themselves are checked in the kubernetes/check module);
// and the Dockerfile's build line runs (dockerfile_test.go).
package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/shaperhq/shaper/internal/cli"
	"github.com/shaperhq/shaper/internal/testsupport"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

const (
	rulesFile     = "prometheus/shaper-alerts.yaml"
	rulesTestFile = "prometheus/shaper-alerts.test.yaml"
	dashboardFile = "grafana/shaper-dashboard.json"
)

// promtool is Debian's prometheus package's checker. scripts/test.sh (make
// test) installs it, so there a missing promtool is a failure; only under
// -short may a developer's machine without it skip.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if testing.Short() {
			t.Skip("promtool not found (apt-get install prometheus); skipped under -short")
		}
		t.Fatal("promtool not found in PATH: run as root ./scripts/test.sh, or apt-get install -y prometheus")
	}
	return p
}

func TestAlertRulesPassPromtool(t *testing.T) {
	out, err := exec.Command(promtool(t), "check", "rules", rulesFile).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules %s: %v\n%s", rulesFile, err, out)
	}
}

// The rules' own tests: each alert fires on series that should raise it,
// with its labels and annotations, and not on those beside them.
func TestAlertRulesFireWhenTheyShould(t *testing.T) {
	out, err := exec.Command(promtool(t), "test", "rules", rulesTestFile).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules %s: %v\n%s", rulesTestFile, err, out)
	}
}

// rule is one alerting rule as the file has it.
type rule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func readRules(t *testing.T) []rule {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []rule `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	var rules []rule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	return rules
}

// Promtool accepts rules without severity or annotations; the conventions
// (kube-prometheus's) are checked here.
func TestAlertRulesFollowConventions(t *testing.T) {
	rules := readRules(t)
	if len(rules) < 7 {
		t.Fatalf("got %d rules, want at least the 7 the issue lists", len(rules))
	}
	for _, r := range rules {
		if r.Alert == "" {
			t.Errorf("a rule with expr %q is not an alert", r.Expr)
			continue
		}
		if !slices.Contains([]string{"critical", "warning", "info"}, r.Labels["severity"]) {
			t.Errorf("%s: severity %q, want critical, warning or info", r.Alert, r.Labels["severity"])
		}
		if r.For == "" {
			t.Errorf("%s: no for:, so one bad scrape pages", r.Alert)
		}
		for _, a := range []string{"summary", "description"} {
			if r.Annotations[a] == "" {
				t.Errorf("%s: no %s annotation", r.Alert, a)
			}
		}
		// An alert per upstream must say which.
		if strings.Contains(r.Expr, "by (upstream)") && !strings.Contains(r.Annotations["summary"], "{{ $labels.upstream }}") {
			t.Errorf("%s: summary %q does not name {{ $labels.upstream }}", r.Alert, r.Annotations["summary"])
		}
	}
}

// panel is the part of a Grafana panel the test reads.
type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

type dashboard struct {
	Title         string  `json:"title"`
	UID           string  `json:"uid"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
			Query      any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// allPanels flattens rows.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		if p.Type == "row" {
			out = append(out, allPanels(p.Panels)...)
			continue
		}
		out = append(out, p)
	}
	return out
}

func TestDashboardPanels(t *testing.T) {
	d := readDashboard(t)
	if d.Title == "" || d.UID == "" {
		t.Errorf("title %q, uid %q: want both set", d.Title, d.UID)
	}
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d, want 36 or later (panels with their own datasource)", d.SchemaVersion)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Name == "upstream" && v.Definition != "label_values(shaper_backlog_jobs, upstream)" {
			t.Errorf("$upstream is defined by %q, want label_values(shaper_backlog_jobs, upstream)", v.Definition)
		}
	}
	if vars["datasource"] != "datasource" || vars["upstream"] != "query" {
		t.Errorf("template variables %v, want datasource (datasource) and upstream (query)", vars)
	}
	ps := allPanels(d.Panels)
	if len(ps) < 7 {
		t.Fatalf("got %d panels, want at least 7", len(ps))
	}
	ids := map[int]bool{}
	for _, p := range ps {
		if p.Title == "" {
			t.Errorf("panel %d has no title", p.ID)
		}
		if ids[p.ID] {
			t.Errorf("panel id %d is used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource uid %q, want ${datasource}", p.Title, p.Datasource.UID)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no target", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q: target %s has no expr", p.Title, tg.RefID)
			}
		}
	}
}

var metricName = regexp.MustCompile(`\bshaper_[a-z0-9_]+`)

// selector is a metric name and its label matchers, if any.
var selector = regexp.MustCompile(`\b(shaper_[a-z0-9_]+)(\{[^}]*\})?`)

// perUpstream are the metrics with an upstream label (docs/operations.md,
// Metrics by process), which every panel must filter by the $upstream variable.
var perUpstream = []string{
	"shaper_jobs_enqueued_total", "shaper_jobs_rejected_total", "shaper_dispatches_total",
	"shaper_upstream_responses_total", "shaper_upstream_request_duration_seconds_bucket",
	"shaper_pacing_wait_seconds_bucket", "shaper_pacing_late_slots_total", "shaper_backlog_jobs",
	"shaper_dispatch_in_flight", "shaper_upstream_paused", "shaper_upstream_blocks_total",
	"shaper_upstream_limit_rate",
}

func TestDashboardFiltersByUpstream(t *testing.T) {
	filtered := 0
	for _, p := range allPanels(readDashboard(t).Panels) {
		for _, tg := range p.Targets {
			for _, m := range selector.FindAllStringSubmatch(tg.Expr, -1) {
				if !slices.Contains(perUpstream, m[1]) {
					continue
				}
				if !strings.Contains(m[2], `upstream=~"$upstream"`) {
					t.Errorf("panel %q, target %s: %s%s is not filtered by $upstream", p.Title, tg.RefID, m[1], m[2])
				}
				filtered++
			}
		}
	}
	if filtered < 10 {
		t.Errorf("found %d per-upstream selectors in the panels, want at least 10", filtered)
	}
}

// queried is every shaper metric named by a rule's expression or a panel's
// query (and the $upstream variable's), with where it is used.
func queried(t *testing.T) map[string][]string {
	t.Helper()
	names := map[string][]string{}
	add := func(where, expr string) {
		found := metricName.FindAllString(expr, -1)
		if len(found) == 0 {
			t.Errorf("%s queries no shaper metric: %q", where, expr)
		}
		for _, n := range found {
			if !slices.Contains(names[n], where) {
				names[n] = append(names[n], where)
			}
		}
	}
	for _, r := range readRules(t) {
		add("alert "+r.Alert, r.Expr)
	}
	d := readDashboard(t)
	for _, p := range allPanels(d.Panels) {
		for _, tg := range p.Targets {
			add(fmt.Sprintf("panel %q", p.Title), tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			add("variable $"+v.Name, v.Definition)
		}
	}
	return names
}

// TestQueriedMetricsAreExported runs the real serve and work commands
// (cli.Main, in this process: the same wiring as the binary, without a
// build), drives one job through them, and scrapes both /metrics. Every
// metric a rule or panel names must be among the families they export; a
// histogram's _bucket, _sum and _count belong to it. Redis is stopped for
// one last scrape so that shaper_redis_errors_total has an event to show.
func TestQueriedMetricsAreExported(t *testing.T) {
	want := queried(t)
	if len(want) < 10 {
		t.Fatalf("found %d metric names in the rules and the dashboard, want at least 10: %v", len(want), want)
	}

	rs := redistest.New(t)
	var sent sync.Map
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent.Store(r.URL.Path, true)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(up.Close)

	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "shaper.yaml")
	cfg := fmt.Sprintf(`
redis: {url: %q}
api:
  keys: [{name: ops, key_env: DEPLOY_TEST_KEY, admin: true}]
  shutdown_timeout: 2s
work:
  shutdown_timeout: 2s
upstreams:
  demo:
    base_url: %q
    limits: [{rate: 50, per: 1s}]
`, rs.URL(), up.URL)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	const key = "k-deploy-test"
	t.Setenv("DEPLOY_TEST_KEY", key)

	apiAddr, workAddr := freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	serveLog := run(t, ctx, "serve", "--config", cfgPath, "--listen", apiAddr)
	workLog := run(t, ctx, "work", "--config", cfgPath, "--metrics-listen", workAddr)
	t.Cleanup(cancel)
	api, workMetrics := "http://"+apiAddr, "http://"+workAddr+"/metrics"
	waitFor(t, 30*time.Second, "serve and work to answer /healthz", func() bool {
		return get(api+"/healthz") == nil && get("http://"+workAddr+"/healthz") == nil
	}, serveLog, workLog)

	// A job enqueued during a pause, which the worker sees blocked and
	// sends after the resume, and a job refused as invalid: the events
	// that create the series the rules and panels read.
	call := func(method, path, body string, wantCode int) {
		t.Helper()
		req, _ := http.NewRequest(method, api+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != wantCode {
			t.Fatalf("%s %s: got %d, want %d: %s", method, path, resp.StatusCode, wantCode, b)
		}
	}
	call("POST", "/v1/upstreams/demo/pause", `{"for": "1m"}`, http.StatusOK)
	call("POST", "/v1/jobs", `{"upstream": "demo", "path": "/one"}`, http.StatusAccepted)
	call("POST", "/v1/jobs", `{"upstream": "demo", "path": "/a/../b"}`, http.StatusBadRequest)
	waitFor(t, 10*time.Second, "work to see the pause", func() bool {
		_, ok := families(t, workMetrics)["shaper_upstream_paused"]
		return ok
	}, serveLog, workLog)
	call("POST", "/v1/upstreams/demo/resume", ``, http.StatusOK)
	waitFor(t, 30*time.Second, "the job to reach the upstream", func() bool {
		_, ok := sent.Load("/one")
		return ok
	}, serveLog, workLog)
	// The worker counts the dispatch after the answer; wait for it.
	var workFams map[string]string
	waitFor(t, 10*time.Second, "work to count the dispatch", func() bool {
		workFams = families(t, workMetrics)
		_, ok := workFams["shaper_dispatches_total"]
		return ok
	}, serveLog, workLog)

	exported := map[string]string{}
	from := map[string][]string{}
	merge := func(proc string, fams map[string]string) {
		for n, typ := range fams {
			exported[n] = typ
			if !slices.Contains(from[n], proc) {
				from[n] = append(from[n], proc)
			}
		}
	}
	merge("work", workFams)
	merge("serve", families(t, api+"/metrics"))
	if err := rs.Stop(); err != nil {
		t.Fatal(err)
	}
	merge("serve", families(t, api+"/metrics")) // the backlog read fails: a Redis error
	if err := rs.Restart(); err != nil {
		t.Fatal(err)
	}

	var missing []string
	for n, where := range want {
		base := n
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(n, suf); ok && exported[b] == "histogram" {
				base = b
			}
		}
		if _, ok := exported[base]; !ok {
			missing = append(missing, fmt.Sprintf("%s (used by %s)", n, strings.Join(where, ", ")))
			continue
		}
		t.Logf("%s: exported by %s", n, strings.Join(from[base], " and "))
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("queried but exported by neither serve nor work:\n  %s", strings.Join(missing, "\n  "))
	}
}

// families scrapes url and returns each metric family it exports with its
// type, from the exposition's TYPE lines.
func families(t *testing.T, url string) map[string]string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			out[f[2]] = f[3]
		}
	}
	if len(out) == 0 {
		t.Fatalf("GET %s: no metric families in\n%s", url, b)
	}
	return out
}

// run starts a shaper command until ctx ends, and checks at cleanup that it
// stopped cleanly.
func run(t *testing.T, ctx context.Context, args ...string) *testsupport.LockedBuffer {
	t.Helper()
	log := &testsupport.LockedBuffer{}
	done := make(chan int, 1)
	go func() { done <- cli.Main(ctx, append(args, "--log-level", "warn"), strings.NewReader(""), log, log) }()
	t.Cleanup(func() {
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("shaper %s exited %d; log:\n%s", args[0], code, log)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("shaper %s did not stop within 30s; log:\n%s", args[0], log)
		}
	})
	return log
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func get(url string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool, logs ...*testsupport.LockedBuffer) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			var all []string
			for _, l := range logs {
				all = append(all, l.String())
			}
			t.Fatalf("waited %s for %s; logs:\n%s", within, what, strings.Join(all, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// shippedConfigEnv is, for each shaper config shipped under deploy/, where
// its environment comes from in the deployment it belongs to: the
// variables it reads must be there. A config added without an entry fails
// TestShippedConfigsValidate.
func shippedConfigEnv(t *testing.T, path string) (map[string]string, bool) {
	t.Helper()
	switch path {
	case "shaper.example.yaml":
		// As its header and `config validate --help` say.
		return map[string]string{"STRIPE_SECRET_KEY": "sk_test_x", "OPENAI_API_KEY": "sk-x"}, true
	case "compose/shaper.yaml":
		return composeEnv(t, readCompose(t).Services["serve-1"]), true
	case "kubernetes/base/shaper.yaml":
		return secretExampleEnv(t), true
	}
	return nil, false
}

// envVar is a ${NAME} or ${NAME:-default} in a config; keyEnv an API
// key's key_env.
var (
	envVar = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(:-[^}]*)?\}`)
	keyEnv = regexp.MustCompile(`key_env:\s*"?([A-Za-z_][A-Za-z0-9_]*)`)
)

// clearConfigEnv unsets, for the rest of the test, every environment
// variable a config may read, so that one of the developer's own cannot
// stand in for one the deployment lacks.
func clearConfigEnv(t *testing.T, config []byte) {
	t.Helper()
	for _, re := range []*regexp.Regexp{envVar, keyEnv} {
		for _, m := range re.FindAllSubmatch(config, -1) {
			t.Setenv(string(m[1]), "")
			os.Unsetenv(string(m[1]))
		}
	}
}

// TestShippedConfigsValidate runs `shaper config validate` on every shaper
// config under deploy/ (a YAML file with upstreams at its top), with the
// environment its deployment gives it and nothing else of the test's.
func TestShippedConfigsValidate(t *testing.T) {
	var found []string
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || (filepath.Ext(path) != ".yaml" && filepath.Ext(path) != ".yml") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var top map[string]yaml.Node
		if yaml.Unmarshal(b, &top) == nil {
			if _, ok := top["upstreams"]; ok {
				found = append(found, filepath.ToSlash(path))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"shaper.example.yaml", "compose/shaper.yaml", "kubernetes/base/shaper.yaml"} {
		if !slices.Contains(found, p) {
			t.Errorf("%s: not found as a shaper config under deploy/", p)
		}
	}
	for _, path := range found {
		t.Run(path, func(t *testing.T) {
			env, ok := shippedConfigEnv(t, path)
			if !ok {
				t.Fatalf("%s is a shaper config shipped without an entry in shippedConfigEnv: say where its environment comes from", path)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			clearConfigEnv(t, b)
			for k, v := range env {
				t.Setenv(k, v)
			}
			var out, errOut bytes.Buffer
			code := cli.Main(context.Background(), []string{"config", "validate", path}, strings.NewReader(""), &out, &errOut)
			if code != 0 || !strings.Contains(out.String(), path+": valid") {
				t.Fatalf("shaper config validate %s with %v: exit %d\n%s%s", path, slices.Sorted(maps.Keys(env)), code, out.String(), errOut.String())
			}
		})
	}
}
