package cli

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/client"
	"github.com/shaperhq/shaper/dispatcher"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/server"
)

// TestJobsCommands: shaper jobs lists, reads, cancels and retries jobs
// through a real API, with a real dispatcher killing and then sending the
// jobs of a Go handler upstream; every failure is printed once.
func TestJobsCommands(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	ups := []shaper.Upstream{
		{Name: "stripe", BaseURL: "https://api.stripe.com", Limits: []leaky.Limit{leaky.PerSecond(100)}},
		{Name: "mail", Limits: []leaky.Limit{leaky.PerSecond(100)}, Retry: shaper.Retry{MaxAttempts: 1}},
	}
	api, q := startAPI(t, rdb, ups, server.Key{Name: "ops", Secret: "k1", Admin: true})
	env := map[string]string{"SHAPER_API_URL": api.URL, "SHAPER_API_KEY": "k1"}
	var ids []string
	for i := range 3 {
		// Due a second apart: scheduled jobs list latest due first.
		info, _, err := q.Enqueue(ctx, &queue.Job{Tenant: "ops", Upstream: "stripe", Path: "/v1/refunds",
			NotBefore: time.Now().Add(time.Hour + time.Duration(i)*time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, info.ID)
	}

	out, errOut, code := run(t, env, "", "jobs", "ls", "--upstream", "stripe")
	if code != 0 || !strings.HasPrefix(out, "ID ") || strings.Count(out, "\n") != 4 || errOut != "" {
		t.Fatalf("ls: exit %d\n%s%s", code, out, errOut)
	}
	for _, id := range ids {
		if !strings.Contains(out, id) || !strings.Contains(out, "scheduled") {
			t.Fatalf("ls lacks %s scheduled:\n%s", id, out)
		}
	}
	out, errOut, code = run(t, env, "", "jobs", "ls", "--upstream", "stripe", "--limit", "2")
	if code != 0 || strings.Count(out, "\n") != 3 || !strings.Contains(errOut, "--cursor ") {
		t.Fatalf("ls --limit 2: exit %d\n%s%s; want 2 rows and the next cursor on stderr", code, out, errOut)
	}
	cursor := strings.Fields(errOut[strings.Index(errOut, "--cursor ")+len("--cursor "):])[0]
	out, _, code = run(t, env, "", "jobs", "ls", "--upstream", "stripe", "--limit", "2", "--cursor", cursor)
	if code != 0 || !strings.Contains(out, ids[0]) {
		t.Fatalf("ls --cursor: exit %d\n%s; want the oldest job %s", code, out, ids[0])
	}
	out, _, code = run(t, env, "", "jobs", "ls", "--upstream", "stripe", "--limit", "1", "--all", "--json")
	var page client.JobPage
	if code != 0 || json.Unmarshal([]byte(out), &page) != nil || len(page.Jobs) != 3 || page.NextCursor != "" || page.Jobs[0].ID != ids[2] {
		t.Fatalf("ls --all --json: exit %d\n%s", code, out)
	}

	out, _, code = run(t, env, "", "jobs", "get", ids[0])
	if code != 0 || !strings.Contains(out, "state:") || !strings.Contains(out, "scheduled") || !strings.Contains(out, "request:          /v1/refunds") {
		t.Fatalf("get: exit %d\n%s", code, out)
	}
	out, _, code = run(t, env, "", "jobs", "cancel", ids[0])
	if code != 0 || out != "cancelled "+ids[0]+": cancelled\n" {
		t.Fatalf("cancel: exit %d %q", code, out)
	}
	_, errOut, code = run(t, env, "", "jobs", "cancel", ids[0])
	if code != 1 || strings.Count(errOut, "shaper: ") != 1 || !strings.Contains(errOut, "409") {
		t.Fatalf("second cancel: exit %d, stderr %q; want one 409", code, errOut)
	}
	out, errOut, code = run(t, env, "", "jobs", "retry", ids[0], ids[1])
	if code != 1 || out != "retried "+ids[0]+": queued\n" || strings.Count(errOut, "shaper: ") != 1 || !strings.Contains(errOut, ids[1]) {
		t.Fatalf("retry of a cancelled and a scheduled job: exit %d, %q, stderr %q", code, out, errOut)
	}
	out, _, code = run(t, env, "", "jobs", "get", ids[0], "--json")
	var got client.Job
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got.State != client.StateQueued || got.Retries != 1 {
		t.Fatalf("get --json after retry: exit %d\n%s", code, out)
	}

	// Dead jobs of a Go handler upstream: listed, retried in bulk, sent.
	var fail atomic.Bool
	fail.Store(true)
	d, err := dispatcher.New(rdb, dispatcher.Config{Upstreams: ups[1:], Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	d.Handle("mail", dispatcher.HandlerFunc(func(ctx context.Context, job *queue.Job) error {
		if fail.Load() {
			return errors.New("mailbox full")
		}
		return nil
	}))
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	mail, _, err := q.Enqueue(ctx, &queue.Job{Tenant: "ops", Upstream: "mail", Task: "welcome"})
	if err != nil {
		t.Fatal(err)
	}
	waitState := func(want string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			out, _, _ := run(t, env, "", "jobs", "ls", "--upstream", "mail", "--state", want)
			if strings.Contains(out, mail.ID) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s never listed %s", mail.ID, want)
			}
		}
	}
	// A dead job whose sensitive headers are gone cannot be sent again:
	// retry-dead leaves it dead and says so.
	locked, _, err := q.Enqueue(ctx, &queue.Job{Tenant: "ops", Upstream: "mail", Task: "welcome",
		Headers: map[string]string{"Authorization": "Bearer x"}})
	if err != nil {
		t.Fatal(err)
	}
	waitState("dead")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if got, err := q.Get(ctx, locked.ID, ""); err == nil && got.State == queue.StateDead {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s never died", locked.ID)
		}
	}
	if keys, _ := rdb.Keys(ctx, "*:secrets:*"+locked.ID+"*").Result(); len(keys) > 0 {
		rdb.Del(ctx, keys...)
	}
	out, _, _ = run(t, env, "", "jobs", "ls", "--upstream", "mail", "--state", "dead")
	if !strings.Contains(out, "mailbox full") || !strings.Contains(out, "1/1") {
		t.Fatalf("dead job row lacks its error and attempts:\n%s", out)
	}
	fail.Store(false)
	out, errOut, code = run(t, env, "", "jobs", "retry-dead", "mail")
	if code != 0 || out != "retried 1 dead jobs of mail\nleft 1 dead: the sensitive headers they need are gone, so they cannot be sent again\n" {
		t.Fatalf("retry-dead: exit %d %q %q", code, out, errOut)
	}
	waitState("succeeded")
	// Without --upstream: every upstream's jobs, in name order.
	out, _, code = run(t, env, "", "jobs", "ls")
	if code != 0 || !strings.Contains(out, mail.ID) || !strings.Contains(out, ids[0]) || strings.Index(out, mail.ID) > strings.Index(out, ids[0]) {
		t.Fatalf("ls without --upstream: exit %d\n%s; want mail's job, then stripe's", code, out)
	}

	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"a lane no upstream has", env, []string{"jobs", "ls", "--lane", "vip"}, "no upstream has it"},
		{"unknown upstream", env, []string{"jobs", "ls", "--upstream", "twilio"}, `no upstream "twilio"`},
		{"bad state", env, []string{"jobs", "ls", "--upstream", "stripe", "--state", "asleep"}, "state"},
		{"bad limit", env, []string{"jobs", "ls", "--upstream", "stripe", "--limit", "500"}, "--limit 500"},
		{"unknown job", env, []string{"jobs", "get", "stripe.default.nope"}, "404"},
		{"no api", nil, []string{"jobs", "get", "x"}, "--api URL"},
		{"unknown subcommand", env, []string{"jobs", "show"}, `unknown command "show"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := run(t, tc.env, "", tc.args...)
			if code != 1 || out != "" || strings.Count(errOut, "shaper: ") != 1 || !strings.Contains(errOut, tc.want) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want one error naming %q", code, out, errOut, tc.want)
			}
		})
	}
}

// TestJobsThroughRedis: with --config (or $SHAPER_CONFIG) shaper jobs acts
// on Redis directly as the operator: every tenant's jobs are listed, read,
// cancelled and retried, and the output is the API's.
func TestJobsThroughRedis(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	cfg := writeFile(t, "jobs.yaml", strings.ReplaceAll(`
redis: {url: "%REDIS%"}
upstreams:
  stripe:
    base_url: https://api.stripe.com
    limits: [{rate: 100, per: 1s}]
`, "%REDIS%", srv.URL()))
	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{{Name: "stripe", BaseURL: "https://api.stripe.com", Limits: []leaky.Limit{leaky.PerSecond(100)}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	var ids []string
	for _, tenant := range []string{"acme", "globex"} {
		info, _, err := q.Enqueue(ctx, &queue.Job{Tenant: tenant, Upstream: "stripe", Path: "/v1/refunds", NotBefore: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, info.ID)
	}

	out, errOut, code := run(t, nil, "", "jobs", "ls", "--upstream", "stripe", "--config", cfg, "--json")
	var page client.JobPage
	if code != 0 || json.Unmarshal([]byte(out), &page) != nil || len(page.Jobs) != 2 {
		t.Fatalf("ls --config: exit %d\n%s%s; want both tenants' jobs", code, out, errOut)
	}
	tenants := map[string]bool{}
	for _, j := range page.Jobs {
		tenants[j.Tenant] = true
	}
	if !tenants["acme"] || !tenants["globex"] {
		t.Errorf("ls --config listed tenants %v, want acme and globex", tenants)
	}

	env := map[string]string{"SHAPER_CONFIG": cfg}
	out, _, code = run(t, env, "", "jobs", "cancel", ids[1])
	if code != 0 || out != "cancelled "+ids[1]+": cancelled\n" {
		t.Fatalf("cancel through $SHAPER_CONFIG: exit %d %q", code, out)
	}
	out, _, code = run(t, env, "", "jobs", "retry", ids[1])
	if code != 0 || out != "retried "+ids[1]+": queued\n" {
		t.Fatalf("retry through $SHAPER_CONFIG: exit %d %q", code, out)
	}
	out, _, code = run(t, env, "", "jobs", "get", ids[1], "--json")
	var got client.Job
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got.State != client.StateQueued || got.Retries != 1 || got.Tenant != "globex" {
		t.Fatalf("get after retry: exit %d\n%s", code, out)
	}
	out, _, code = run(t, env, "", "jobs", "retry-dead", "stripe")
	if code != 0 || out != "retried 0 dead jobs of stripe\n" {
		t.Fatalf("retry-dead with none dead: exit %d %q", code, out)
	}
	out, _, code = run(t, env, "", "jobs", "retry-dead", "stripe", "--json")
	if code != 0 || strings.Join(strings.Fields(out), "") != `{"upstream":"stripe","retried":0,"skipped":0}` {
		t.Fatalf("retry-dead --json: exit %d %q", code, out)
	}
	_, errOut, code = run(t, nil, "", "jobs", "ls", "--upstream", "stripe")
	if code != 1 || !strings.Contains(errOut, "--config") || !strings.Contains(errOut, "--api") {
		t.Fatalf("ls with neither --config nor --api: exit %d, stderr %q", code, errOut)
	}
}
