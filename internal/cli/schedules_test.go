package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/client"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/server"
)

// TestSchedulesCommands: shaper schedules adds, lists, reads, pauses,
// resumes and removes schedules through a real API.
func TestSchedulesCommands(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	ups := []shaper.Upstream{{Name: "reports", BaseURL: "https://reports.example.com", Limits: []leaky.Limit{leaky.PerSecond(10)}}}
	api, _ := startAPI(t, rdb, ups, server.Key{Name: "ops", Secret: "k1"})
	env := map[string]string{"SHAPER_API_URL": api.URL, "SHAPER_API_KEY": "k1"}

	out, errOut, code := run(t, env, "", "schedules", "add", "nightly", "--cron", "30 2 * * *", "--timezone", "Europe/Berlin",
		"--upstream", "reports", "--method", "POST", "--path", "/v1/run", "--body", `{"a":1}`)
	if code != 0 || !strings.Contains(out, "next run:") || !strings.Contains(out, "Europe/Berlin") {
		t.Fatalf("add: exit %d\n%s%s", code, out, errOut)
	}
	_, errOut, code = run(t, env, `{"upstream":"reports","path":"/v1/digest"}`, "schedules", "add", "digest", "--cron", "@every 1h", "--catch-up", "none", "--job", "@-")
	if code != 0 {
		t.Fatalf("add --job @-: exit %d %s", code, errOut)
	}
	_, errOut, code = run(t, env, "", "schedules", "add", "bad", "--cron", "61 * * * *", "--upstream", "nope", "--path", "/x")
	if code != 1 || !strings.Contains(errOut, "cron") || !strings.Contains(errOut, "job.upstream") {
		t.Fatalf("add invalid: exit %d, stderr %q; want both fields named", code, errOut)
	}
	out, _, code = run(t, env, "", "schedules", "ls")
	if code != 0 || !strings.HasPrefix(out, "NAME ") || strings.Count(out, "\n") != 3 || !strings.Contains(out, "digest") || !strings.Contains(out, "active") {
		t.Fatalf("ls: exit %d\n%s", code, out)
	}
	out, _, code = run(t, env, "", "schedules", "pause", "nightly")
	if code != 0 || !strings.Contains(out, "paused") {
		t.Fatalf("pause: exit %d\n%s", code, out)
	}
	out, _, code = run(t, env, "", "schedules", "get", "nightly", "--json")
	var s client.Schedule
	if code != 0 || json.Unmarshal([]byte(out), &s) != nil || !s.Paused || s.Job.Path != "/v1/run" || string(s.Job.Body) != `{"a":1}` {
		t.Fatalf("get --json: exit %d\n%s", code, out)
	}
	out, _, code = run(t, env, "", "schedules", "resume", "nightly")
	if code != 0 || !strings.Contains(out, "active") {
		t.Fatalf("resume: exit %d\n%s", code, out)
	}
	out, _, code = run(t, env, "", "schedules", "rm", "nightly", "digest")
	if code != 0 || out != "removed nightly\nremoved digest\n" {
		t.Fatalf("rm: exit %d %q", code, out)
	}
	_, errOut, code = run(t, env, "", "schedules", "get", "nightly")
	if code != 1 || !strings.Contains(errOut, "404") {
		t.Fatalf("get after rm: exit %d %q", code, errOut)
	}
}
