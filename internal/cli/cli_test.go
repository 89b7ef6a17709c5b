package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/server"
	"github.com/shaperhq/shaper/status"
	"github.com/shaperhq/shaper/tokenbucket"
)

var srv *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &srv) }

// run executes the command line with args and the given environment and
// returns stdout, stderr and the exit code.
func run(t *testing.T, env map[string]string, stdin string, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	f := &Factory{In: strings.NewReader(stdin), Out: &out, ErrOut: &errOut, LookupEnv: func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	}}
	code := f.execute(context.Background(), args)
	return out.String(), errOut.String(), code
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const goodConfig = `
redis: {url: "%REDIS%"}
api:
  keys: [{name: ops, key_env: OPS_KEY, admin: true}]
upstreams:
  stripe:
    base_url: https://api.stripe.com
    limits: [{rate: 100, per: 1s}]
    lanes: {default: 1, bulk: 1}
`

// handlerConfig has only an upstream served by a Go handler.
const handlerConfig = `
redis: {url: "%REDIS%"}
upstreams:
  mail:
    handler: true
    limits: [{rate: 10, per: 1s}]
`

func TestCommands(t *testing.T) {
	good := writeFile(t, "good.yaml", strings.ReplaceAll(goodConfig, "%REDIS%", srv.URL()))
	handlers := writeFile(t, "handlers.yaml", strings.ReplaceAll(handlerConfig, "%REDIS%", srv.URL()))
	bad := writeFile(t, "bad.yaml", "upstreams:\n  stripe:\n    base_url: ftp://x\n    limits: [{rate: 0, per: 1s}]\n    colour: red\n")
	badPartitions := writeFile(t, "partitions.yaml", `
api:
  keys: [{name: billing, key_env: K}]
upstreams:
  mail:
    base_url: https://relay.example.com
    limits: [{rate: 200, per: 1s}]
    partition_limits: [{rate: 0, per: 1m}]
    partition_overrides: {gmail.com: [{rate: 1000, per: 1m, cost: tokens}]}
    fairness: {by: tenants, weights: {biling: 3}}
`)
	for _, tc := range []struct {
		name    string
		args    []string
		code    int
		out     string // substring of stdout
		errOut  string // substring of stderr
		notHave string
	}{
		{name: "version", args: []string{"version"}, out: "shaper dev (revision "},
		{name: "version names go", args: []string{"version"}, out: ", go1."},
		{name: "--version", args: []string{"--version"}, out: "shaper version dev"},
		{name: "help lists every command", args: []string{"--help"}, out: "status"},
		{name: "work help has examples", args: []string{"work", "--help"}, out: "shaper work --config shaper.yaml --upstream stripe"},
		{name: "dev help", args: []string{"dev", "--help"}, out: "--api-key"},
		{name: "unknown command", args: []string{"launch"}, code: 1, errOut: `unknown command "launch"`},
		{name: "valid config", args: []string{"config", "validate", good}, out: "valid"},
		{name: "valid config summary", args: []string{"config", "validate", good}, out: "upstream stripe: https://api.stripe.com at 100 requests per 1s"},
		{name: "invalid config lists every problem", args: []string{"config", "validate", bad}, code: 1, errOut: "3 problem(s)"},
		{name: "invalid config names fields", args: []string{"config", "validate", bad}, code: 1, errOut: "upstreams.stripe.limits[0]: rate 0: must be at least 1"},
		{name: "invalid partitions list every problem", args: []string{"config", "validate", badPartitions}, code: 1, errOut: "3 problem(s)"},
		{name: "invalid partition limit", args: []string{"config", "validate", badPartitions}, code: 1, errOut: "line 8: upstreams.mail.partition_limits[0]: rate 0: must be at least 1"},
		{name: "invalid override cost", args: []string{"config", "validate", badPartitions}, code: 1, errOut: `upstreams.mail.partition_overrides["gmail.com"][0].cost: "tokens" is counted by none of the upstream's limits`},
		{name: "invalid fairness", args: []string{"config", "validate", badPartitions}, code: 1, errOut: `upstreams.mail.fairness.by: "tenants" is not one of tenant, partition, none`},
		{name: "missing config file", args: []string{"config", "validate", "/nonexistent.yaml"}, code: 1, errOut: "nonexistent.yaml"},
		{name: "work needs --config", args: []string{"work"}, code: 1, errOut: "--config FILE (or $SHAPER_CONFIG) is required"},
		{name: "serve needs --config", args: []string{"serve"}, code: 1, errOut: "--config FILE (or $SHAPER_CONFIG) is required"},
		{name: "status needs --config", args: []string{"status"}, code: 1, errOut: "--config FILE (or $SHAPER_CONFIG) is required"},
		{name: "work unknown upstream", args: []string{"work", "--config", good, "--upstream", "twilio"}, code: 1, errOut: "--upstream twilio: no such upstream"},
		{name: "work refuses a named handler upstream", args: []string{"work", "--config", handlers, "--upstream", "mail"}, code: 1, errOut: "upstream mail is served by a Go handler"},
		{name: "work with only handler upstreams", args: []string{"work", "--config", handlers, "--metrics-listen", "off"}, code: 1, errOut: "no HTTP upstreams to drain"},
		{name: "work metrics listener refused", args: []string{"work", "--config", good, "--metrics-listen", "256.0.0.1:1"}, code: 1, errOut: "metrics listener"},
		{name: "dev bad demo rate", args: []string{"dev", "--demo-rate", "0"}, code: 1, errOut: "--demo-rate 0: must be between 1 and 10000"},
		{name: "dev api key with a space", args: []string{"dev", "--api-key", "a b"}, code: 1, errOut: "--api-key must not contain whitespace"},
		{name: "dev listen refused", args: []string{"dev", "--listen", "256.0.0.1:1", "--redis", "%REDIS%"}, code: 1, errOut: "listen on 256.0.0.1:1"},
		{name: "status bad interval", args: []string{"status", "--config", good, "--interval", "1ms"}, code: 1, errOut: "--interval"},
		{name: "enqueue needs the API", args: []string{"enqueue", "--upstream", "stripe", "--path", "/x"}, code: 1, errOut: "--api URL"},
		{name: "enqueue needs path or task", args: []string{"enqueue", "--upstream", "stripe"}, code: 1, errOut: "--path"},
		{name: "enqueue bad header", args: []string{"enqueue", "--upstream", "s", "--path", "/x", "--header", "nocolon", "--api", "http://x", "--api-key", "k"}, code: 1, errOut: "want 'Name: value'"},
		{name: "enqueue data twice", args: []string{"enqueue", "--upstream", "s", "--path", "/x", "--data", "{}", "--data-file", "-", "--api", "http://x", "--api-key", "k"}, code: 1, errOut: "give --data or --data-file, not both"},
		{name: "enqueue bad not-before", args: []string{"enqueue", "--upstream", "s", "--path", "/x", "--not-before", "tomorrow", "--api", "http://x", "--api-key", "k"}, code: 1, errOut: "want an RFC 3339 time"},
		{name: "enqueue needs a key", args: []string{"enqueue", "--upstream", "s", "--path", "/x", "--api", "http://x"}, code: 1, errOut: "--api-key (or $SHAPER_API_KEY) is required"},
		{name: "enqueue partition too long", args: []string{"enqueue", "--upstream", "s", "--path", "/x", "--partition", strings.Repeat("p", 201), "--api", "http://x", "--api-key", "k"}, code: 1, errOut: "--partition: is 201 bytes: must be at most 200"},
		{name: "enqueue partition with a line break", args: []string{"enqueue", "--upstream", "s", "--path", "/x", "--partition", "a\nb", "--api", "http://x", "--api-key", "k"}, code: 1, errOut: "--partition: holds a control character"},
		{name: "enqueue bad cost", args: []string{"enqueue", "--upstream", "s", "--path", "/x", "--cost", "tokens", "--api", "http://x", "--api-key", "k"}, code: 1, errOut: "NAME=N"},
		{name: "pause needs a target", args: []string{"pause", "stripe"}, code: 1, errOut: "give --config FILE or $SHAPER_CONFIG"},
		{name: "pause unknown upstream", args: []string{"pause", "twilio", "--config", good}, code: 1, errOut: `no upstream "twilio"`},
		{name: "pause negative", args: []string{"pause", "stripe", "--for", "-1s", "--config", good}, code: 1, errOut: "must be positive"},
		{name: "pause", args: []string{"pause", "stripe", "--for", "10m", "--config", good}, out: "paused stripe for 10m0s"},
		{name: "paused shows in status", args: []string{"status", "--config", good}, out: "paused from the command line"},
		{name: "resume", args: []string{"resume", "stripe", "--config", good}, out: "resumed stripe"},
		{name: "resumed status", args: []string{"status", "--config", good}, out: "stripe", notHave: "paused from"},
		{name: "bad log level", args: []string{"work", "--config", good, "--log-level", "loud"}, code: 1, errOut: "--log-level"},
		{name: "redis override refused", args: []string{"status", "--config", good, "--redis", "redis://127.0.0.1:1/0"}, code: 1, errOut: "redis does not answer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := make([]string, len(tc.args))
			for i, a := range tc.args {
				args[i] = strings.ReplaceAll(a, "%REDIS%", srv.URL())
			}
			out, errOut, code := run(t, nil, "", args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.code, out, errOut)
			}
			if !strings.Contains(out, tc.out) {
				t.Errorf("stdout %q lacks %q", out, tc.out)
			}
			if !strings.Contains(errOut, tc.errOut) {
				t.Errorf("stderr %q lacks %q", errOut, tc.errOut)
			}
			if tc.notHave != "" && strings.Contains(out, tc.notHave) {
				t.Errorf("stdout %q should not contain %q", out, tc.notHave)
			}
		})
	}
}

// TestConfigFromEnv checks that $SHAPER_CONFIG stands in for --config on
// every command that reads a config, and that the flag wins over it.
func TestConfigFromEnv(t *testing.T) {
	good := writeFile(t, "good.yaml", strings.ReplaceAll(goodConfig, "%REDIS%", srv.URL()))
	env := map[string]string{"SHAPER_CONFIG": good}
	for _, tc := range []struct {
		name   string
		env    map[string]string
		args   []string
		code   int
		out    string
		errOut string
	}{
		{name: "status", env: env, args: []string{"status"}, out: "stripe"},
		{name: "pause", env: env, args: []string{"pause", "stripe", "--for", "1m"}, out: "paused stripe for 1m0s"},
		{name: "resume", env: env, args: []string{"resume", "stripe"}, out: "resumed stripe"},
		{name: "work reads it", env: env, args: []string{"work", "--upstream", "twilio"}, code: 1, errOut: "--upstream twilio: no such upstream"},
		{name: "serve reads it", env: map[string]string{"SHAPER_CONFIG": "/nonexistent/env.yaml"}, args: []string{"serve"}, code: 1, errOut: "/nonexistent/env.yaml"},
		{name: "the flag wins", env: map[string]string{"SHAPER_CONFIG": "/nonexistent/env.yaml"}, args: []string{"status", "--config", good}, out: "stripe"},
		{name: "the flag wins for pause", env: map[string]string{"SHAPER_CONFIG": "/nonexistent/env.yaml"}, args: []string{"resume", "stripe", "--config", good}, out: "resumed stripe"},
		{name: "--api wins over the environment's config", env: map[string]string{"SHAPER_CONFIG": good}, args: []string{"resume", "stripe", "--api", "http://127.0.0.1:1", "--api-key", "k"}, code: 1, errOut: "127.0.0.1:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := run(t, tc.env, "", tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.code, out, errOut)
			}
			if !strings.Contains(out, tc.out) {
				t.Errorf("stdout %q lacks %q", out, tc.out)
			}
			if !strings.Contains(errOut, tc.errOut) {
				t.Errorf("stderr %q lacks %q", errOut, tc.errOut)
			}
		})
	}
}

func TestStatusJSON(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	good := writeFile(t, "good.yaml", strings.ReplaceAll(goodConfig, "%REDIS%", srv.URL()))
	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{{Name: "stripe", Limits: []leaky.Limit{leaky.PerSecond(1000)}, Lanes: map[string]int{"default": 1, "bulk": 1}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	for i := 0; i < 3; i++ {
		if _, _, err := q.Enqueue(ctx, &queue.Job{Upstream: "stripe", Lane: []string{"default", "bulk", "bulk"}[i]}); err != nil {
			t.Fatal(err)
		}
	}
	out, errOut, code := run(t, nil, "", "status", "--config", good, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got struct {
		Upstreams []struct {
			Name    string `json:"name"`
			Backlog struct {
				Total int64                       `json:"total"`
				Lanes map[string]queue.LaneCounts `json:"lanes"`
			} `json:"backlog"`
			TimeToDrain *float64 `json:"time_to_drain_seconds"`
		} `json:"upstreams"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	u := got.Upstreams[0]
	if u.Name != "stripe" || u.Backlog.Total != 3 || u.Backlog.Lanes["bulk"].Pending != 2 || u.TimeToDrain != nil {
		t.Fatalf("got %+v; want 3 queued (2 on bulk) and no drain estimate while nothing drains", u)
	}
	// The table shows the lanes and that nothing drains.
	out, _, _ = run(t, nil, "", "status", "--config", good)
	if !strings.Contains(out, "3 (bulk=2 default=1)") || !strings.Contains(out, "stalled") {
		t.Fatalf("table:\n%s", out)
	}
}

// TestStatusPartitions: status shows how many partitions have backlog and
// the busiest ones, in the table and in --json; an upstream without
// partitions shows no such line.
func TestStatusPartitions(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	cfg := writeFile(t, "mail.yaml", strings.ReplaceAll(`
redis: {url: "%REDIS%"}
upstreams:
  mail:
    base_url: https://relay.example.com
    limits: [{rate: 200, per: 1s}]
    partition_limits: [{rate: 100, per: 1m}]
  stripe:
    base_url: https://api.stripe.com
    limits: [{rate: 100, per: 1s}]
`, "%REDIS%", srv.URL()))
	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{
		{Name: "mail", Limits: []leaky.Limit{leaky.PerSecond(200)}, PartitionLimits: []leaky.Limit{leaky.PerMinute(100)}},
		{Name: "stripe", Limits: []leaky.Limit{leaky.PerSecond(100)}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	for p, n := range map[string]int{"a.example": 5, "b.example": 3} {
		for i := 0; i < n; i++ {
			if _, _, err := q.Enqueue(ctx, &queue.Job{Upstream: "mail", Tenant: "billing", Partition: p}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, _, err := q.Enqueue(ctx, &queue.Job{Upstream: "stripe", Tenant: "billing"}); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := run(t, nil, "", "status", "--config", cfg)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if want := "mail: partitions with backlog: 2 (top: a.example 5, b.example 3)\n"; !strings.Contains(out, want) {
		t.Fatalf("table lacks %q:\n%s", want, out)
	}
	if strings.Contains(out, "stripe: partitions") {
		t.Fatalf("table shows partitions for stripe, which has none:\n%s", out)
	}
	out, errOut, code = run(t, nil, "", "status", "--config", cfg, "--json", "--upstream", "mail")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got struct {
		Upstreams []struct {
			Partitions status.Partitions `json:"partitions"`
		} `json:"upstreams"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got.Upstreams) != 1 {
		t.Fatalf("not the JSON of one upstream (%v):\n%s", err, out)
	}
	p := got.Upstreams[0].Partitions
	want := []status.PartitionBacklog{{Partition: "a.example", Backlog: 5}, {Partition: "b.example", Backlog: 3}}
	if p.WithBacklog != 2 || len(p.Top) != 2 || p.Top[0] != want[0] || p.Top[1] != want[1] {
		t.Fatalf("JSON partitions: got %+v, want 2 with backlog, top %+v", p, want)
	}
}

func TestEnqueueThroughAPI(t *testing.T) {
	// A stand-in API that accepts one job and reports it succeeded.
	var gotAuth, gotBody string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth = r.Header.Get("Authorization")
		b := new(bytes.Buffer)
		b.ReadFrom(r.Body)
		if r.Method == "POST" {
			gotBody = b.String()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(202)
			w.Write([]byte(`{"id":"demo.default.abc","state":"queued","upstream":"demo","lane":"default"}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"id":"demo.default.abc","state":"succeeded","upstream":"demo","lane":"default","attempts":1,"response":{"status":200,"body":"hi"}}`))
	}))
	defer api.Close()
	env := map[string]string{"SHAPER_API_URL": api.URL, "SHAPER_API_KEY": "k1"}
	out, errOut, code := run(t, env, `{"from":"stdin"}`, "enqueue", "--upstream", "demo", "--path", "/v1/x", "--data-file", "-",
		"--header", "Content-Type: application/json", "--cost", "tokens=5", "--wait", "--wait-timeout", "10s")
	if code != 0 {
		t.Fatalf("exit %d: %s %s", code, out, errOut)
	}
	if gotAuth != "Bearer k1" || !strings.Contains(gotBody, `"body":"{\"from\":\"stdin\"}"`) || !strings.Contains(gotBody, `"tokens":5`) {
		t.Fatalf("API got auth %q body %s", gotAuth, gotBody)
	}
	if !strings.Contains(out, "succeeded") || !strings.Contains(out, "upstream answered 200") {
		t.Fatalf("stdout: %s", out)
	}
}

// TestEnqueuePartition: --partition reaches a real API server and is
// stored with the job.
func TestEnqueuePartition(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	ups := []shaper.Upstream{{Name: "mail", BaseURL: "https://relay.example.com", Limits: []leaky.Limit{leaky.PerSecond(200)},
		PartitionLimits: []leaky.Limit{leaky.PerMinute(100)}}}
	api, q := startAPI(t, rdb, ups, server.Key{Name: "billing", Secret: "k1"})

	env := map[string]string{"SHAPER_API_URL": api.URL, "SHAPER_API_KEY": "k1"}
	out, errOut, code := run(t, env, "", "enqueue", "--upstream", "mail", "--path", "/v1/send", "--partition", "example.org", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s %s", code, out, errOut)
	}
	var job struct {
		ID        string `json:"id"`
		Partition string `json:"partition"`
	}
	if err := json.Unmarshal([]byte(out), &job); err != nil || job.Partition != "example.org" {
		t.Fatalf("got %s (%v), want the job with partition example.org", out, err)
	}
	info, err := q.Get(ctx, job.ID, "billing")
	if err != nil || info.Partition != "example.org" {
		t.Fatalf("stored job: got %+v, %v; want partition example.org", info, err)
	}
	out, _, code = run(t, env, "", "enqueue", "--upstream", "mail", "--path", "/v1/send", "--partition", "gmail.com")
	if code != 0 || !strings.Contains(out, `partition "gmail.com"`) {
		t.Fatalf("exit %d, stdout %q: want the partition shown", code, out)
	}
}

// TestEnqueueImpossibleCost: a job whose cost can never fit a limit is
// refused by a real API server, and the command says why once.
func TestEnqueueImpossibleCost(t *testing.T) {
	rdb := srv.Client(t)
	rdb.FlushAll(context.Background())
	ups := []shaper.Upstream{{Name: "llm", BaseURL: "https://llm.example.com",
		Limits: []leaky.Limit{leaky.PerSecond(10), {Rate: 2000, Per: time.Second, Cost: "tokens"}}}}
	api, _ := startAPI(t, rdb, ups, server.Key{Name: "billing", Secret: "k1"})

	env := map[string]string{"SHAPER_API_URL": api.URL, "SHAPER_API_KEY": "k1"}
	out, errOut, code := run(t, env, "", "enqueue", "--upstream", "llm", "--path", "/v1/chat", "--cost", "tokens=5000")
	const reason = `cost.tokens 5000 can never be sent: limit "2000 tokens per 1s" takes at most 500 per job (raise its burst)`
	want := "shaper: enqueue to llm: 400 Invalid job: " + reason + "\n"
	if code != 1 || out != "" || errOut != want {
		t.Fatalf("got exit %d, stdout %q, stderr %q; want 1, nothing, %q", code, out, errOut, want)
	}
}

// TestEnqueueWaitExitCodes: enqueue --wait exits 0 when the job succeeds,
// 2 when it is dead or cancelled, 3 when --wait-timeout passes first, and
// 1 when waiting fails otherwise.
func TestEnqueueWaitExitCodes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		state   string // what GET answers; "" for a 404
		timeout string
		code    int
		errOut  string
	}{
		{name: "succeeded", state: "succeeded", timeout: "10s", code: 0},
		{name: "dead", state: "dead", timeout: "10s", code: 2},
		{name: "cancelled", state: "cancelled", timeout: "10s", code: 2},
		{name: "still queued", state: "queued", timeout: "300ms", code: 3, errOut: "not finished after --wait-timeout 300ms (last seen queued)"},
		{name: "the API fails", state: "", timeout: "10s", code: 1, errOut: "waiting for demo.default.abc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == "POST" {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(202)
					w.Write([]byte(`{"id":"demo.default.abc","state":"queued","upstream":"demo","lane":"default"}`))
					return
				}
				if tc.state == "" {
					w.Header().Set("Content-Type", "application/problem+json")
					w.WriteHeader(404)
					w.Write([]byte(`{"title":"Not found","status":404,"detail":"no such job"}`))
					return
				}
				w.Header().Set("Content-Type", "application/json")
				w.Write([]byte(`{"id":"demo.default.abc","state":"` + tc.state + `","upstream":"demo","lane":"default","attempts":1}`))
			}))
			defer api.Close()
			env := map[string]string{"SHAPER_API_URL": api.URL, "SHAPER_API_KEY": "k1"}
			out, errOut, code := run(t, env, "", "enqueue", "--upstream", "demo", "--path", "/v1/x", "--wait", "--wait-timeout", tc.timeout)
			if code != tc.code {
				t.Fatalf("got exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.code, out, errOut)
			}
			if !strings.Contains(errOut, tc.errOut) {
				t.Errorf("stderr %q lacks %q", errOut, tc.errOut)
			}
			if tc.state != "" && tc.state != "queued" && !strings.Contains(out, tc.state) {
				t.Errorf("stdout %q does not name the outcome %s", out, tc.state)
			}
		})
	}
}

// TestErrorsPrintedOnce: whatever fails, cobra prints neither the error
// nor the usage, and the command line prints the error once.
func TestErrorsPrintedOnce(t *testing.T) {
	bad := writeFile(t, "bad.yaml", "upstreams:\n  stripe:\n    base_url: ftp://x\n    limits: [{rate: 0, per: 1s}]\n")
	for _, tc := range []struct {
		name string
		args []string
		want string // the error's text, to be found exactly once
	}{
		{name: "unknown command", args: []string{"launch"}, want: `unknown command "launch"`},
		{name: "unknown flag", args: []string{"status", "--bogus"}, want: "unknown flag: --bogus"},
		{name: "bad flag value", args: []string{"status", "--interval", "soon"}, want: `invalid argument "soon"`},
		{name: "too many arguments", args: []string{"version", "extra"}, want: `unknown command "extra"`},
		{name: "missing argument", args: []string{"pause"}, want: "accepts 1 arg(s), received 0"},
		{name: "missing required flag", args: []string{"enqueue", "--path", "/x"}, want: `"upstream" not set`},
		{name: "no config", args: []string{"work"}, want: "--config FILE (or $SHAPER_CONFIG) is required"},
		{name: "invalid config", args: []string{"config", "validate", bad}, want: "rate 0: must be at least 1"},
		{name: "unreachable API", args: []string{"enqueue", "--upstream", "s", "--path", "/x", "--api", "http://127.0.0.1:1", "--api-key", "k", "--retry", "0"}, want: "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := run(t, nil, "", tc.args...)
			if code == 0 {
				t.Fatalf("exit 0, want a failure\nstdout: %s\nstderr: %s", out, errOut)
			}
			if n := strings.Count(errOut, tc.want); n != 1 {
				t.Errorf("stderr has %q %d times, want once:\n%s", tc.want, n, errOut)
			}
			if n := strings.Count(errOut, "shaper: "); n > 1 {
				t.Errorf("stderr has %d error lines, want at most one:\n%s", n, errOut)
			}
			for _, noise := range []string{"Error:", "Usage:"} {
				if strings.Contains(out+errOut, noise) {
					t.Errorf("output has cobra's %q:\nstdout: %s\nstderr: %s", noise, out, errOut)
				}
			}
		})
	}
}

// TestStatusThroughAPI: status --api reads a real API server and shows
// what status --config reads from Redis, without a config.
func TestStatusThroughAPI(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	good := writeFile(t, "good.yaml", strings.ReplaceAll(goodConfig, "%REDIS%", srv.URL()))
	ups := []shaper.Upstream{
		{Name: "stripe", BaseURL: "https://api.stripe.com", Limits: []leaky.Limit{leaky.PerSecond(100)}, Lanes: map[string]int{"default": 1, "bulk": 1}},
	}
	api, _ := startAPI(t, rdb, ups, server.Key{Name: "ops", Secret: "k1", Admin: true})
	env := map[string]string{"SHAPER_API_URL": api.URL, "SHAPER_API_KEY": "k1"}
	for i := 0; i < 3; i++ {
		if _, errOut, code := run(t, env, "", "enqueue", "--upstream", "stripe", "--path", "/v1/refunds", "--lane", "bulk"); code != 0 {
			t.Fatalf("enqueue: exit %d: %s", code, errOut)
		}
	}
	if _, errOut, code := run(t, env, "", "pause", "stripe"); code != 0 {
		t.Fatalf("pause: exit %d: %s", code, errOut)
	}

	want, errOut, code := run(t, nil, "", "status", "--config", good)
	if code != 0 {
		t.Fatalf("status --config: exit %d: %s", code, errOut)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
	}{
		{name: "flags", args: []string{"status", "--api", api.URL, "--api-key", "k1"}},
		{name: "environment", env: env, args: []string{"status"}},
		{name: "one upstream", env: env, args: []string{"status", "--upstream", "stripe"}},
		{name: "--api wins over $SHAPER_CONFIG", env: map[string]string{"SHAPER_CONFIG": "/nonexistent.yaml", "SHAPER_API_KEY": "k1"}, args: []string{"status", "--api", api.URL}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, errOut, code := run(t, tc.env, "", tc.args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			if got != want {
				t.Errorf("through the API:\n%s\nwant what Redis shows:\n%s", got, want)
			}
			if !strings.Contains(got, "bulk=3") || !strings.Contains(got, "until resumed") {
				t.Errorf("got:\n%s\nwant the bulk backlog of 3 and the pause", got)
			}
		})
	}

	out, errOut, code := run(t, env, "", "status", "--json")
	var doc struct {
		Upstreams []status.Upstream `json:"upstreams"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &doc) != nil || len(doc.Upstreams) != 1 || doc.Upstreams[0].Backlog.Total != 3 || doc.Upstreams[0].PausedUntil == nil {
		t.Fatalf("status --api --json: exit %d, %s %s: want stripe with backlog 3, paused", code, out, errOut)
	}
	// The held jobs read the same through the API as from Redis.
	if u := doc.Upstreams[0]; u.Scheduled != 3 || u.WaitingFor["pause"] != 3 || u.Backlog.Lanes["bulk"].WaitingFor["pause"] != 3 {
		t.Errorf("status --api --json: scheduled %d, waiting for %v, lanes %+v; want the 3 bulk jobs waiting for the pause",
			u.Scheduled, u.WaitingFor, u.Backlog.Lanes)
	}
	_, errOut, code = run(t, env, "", "status", "--upstream", "twilio")
	if code != 1 || !strings.Contains(errOut, "twilio") {
		t.Errorf("unknown upstream through the API: exit %d, stderr %q", code, errOut)
	}
	_, errOut, code = run(t, map[string]string{"SHAPER_API_URL": api.URL, "SHAPER_API_KEY": "wrong"}, "", "status")
	if code != 1 || strings.Count(errOut, "shaper: ") != 1 {
		t.Errorf("wrong key: exit %d, stderr %q; want one error", code, errOut)
	}
}

// startAPI serves shaper's API for ups on rdb with one key, as `shaper
// serve` would, until the test ends.
func startAPI(t *testing.T, rdb *redis.Client, ups []shaper.Upstream, key server.Key) (*httptest.Server, *queue.Queue) {
	t.Helper()
	q, err := queue.New(rdb, queue.Config{Upstreams: ups})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	st, err := status.NewReader(rdb, q, "")
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.New(rdb, q, st, server.Config{Keys: []server.Key{key},
		Admission: tokenbucket.Limit{Capacity: 100, Refill: 100, Per: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(s.Handler())
	t.Cleanup(api.Close)
	return api, q
}
