package cli

import (
	"slices"
	"strings"
	"testing"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/server"
)

const twoUpstreams = `
redis: {url: "%REDIS%"}
upstreams:
  stripe:
    base_url: https://api.stripe.com
    limits: [{rate: 100, per: 1s}]
  openai:
    base_url: https://api.openai.com
    limits: [{rate: 50, per: 1s}]
  slack:
    base_url: https://slack.com
    limits: [{rate: 1, per: 1s}]
`

// completions runs cobra's hidden __complete command, as a shell does,
// and returns the candidates it offers.
func completions(t *testing.T, env map[string]string, args ...string) []string {
	t.Helper()
	out, errOut, code := run(t, env, "", append([]string{"__complete"}, args...)...)
	if code != 0 {
		t.Fatalf("__complete %v: exit %d: %s", args, code, errOut)
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line != "" && !strings.HasPrefix(line, ":") {
			got = append(got, line)
		}
	}
	return got
}

func TestCompleteUpstreams(t *testing.T) {
	cfg := writeFile(t, "two.yaml", strings.ReplaceAll(twoUpstreams, "%REDIS%", srv.URL()))
	env := map[string]string{"SHAPER_CONFIG": cfg}
	all := []string{"openai", "slack", "stripe"}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want []string
	}{
		{name: "pause from --config", args: []string{"pause", "--config", cfg, ""}, want: all},
		{name: "pause from $SHAPER_CONFIG", env: env, args: []string{"pause", ""}, want: all},
		{name: "a prefix", env: env, args: []string{"resume", "s"}, want: []string{"slack", "stripe"}},
		{name: "one name only", env: env, args: []string{"pause", "stripe", ""}, want: nil},
		{name: "work --upstream", args: []string{"work", "--config", cfg, "--upstream", "o"}, want: []string{"openai"}},
		{name: "status --upstream", env: env, args: []string{"status", "--upstream", ""}, want: all},
		{name: "enqueue --upstream", env: env, args: []string{"enqueue", "--upstream", "st"}, want: []string{"stripe"}},
		{name: "no config", args: []string{"pause", ""}, want: nil},
		{name: "a config that does not load", env: map[string]string{"SHAPER_CONFIG": "/nonexistent.yaml"}, args: []string{"pause", ""}, want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := completions(t, tc.env, tc.args...); !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestCompleteUpstreamsThroughAPI: without a config, names come from a
// running API.
func TestCompleteUpstreamsThroughAPI(t *testing.T) {
	rdb := srv.Client(t)
	ups := []shaper.Upstream{
		{Name: "mail", BaseURL: "https://relay.example.com", Limits: []leaky.Limit{leaky.PerSecond(10)}},
		{Name: "maps", BaseURL: "https://maps.example.com", Limits: []leaky.Limit{leaky.PerSecond(10)}},
	}
	api, _ := startAPI(t, rdb, ups, server.Key{Name: "ops", Secret: "k1"})
	env := map[string]string{"SHAPER_API_URL": api.URL, "SHAPER_API_KEY": "k1"}
	if got, want := completions(t, env, "enqueue", "--upstream", "ma"), []string{"mail", "maps"}; !slices.Equal(got, want) {
		t.Errorf("enqueue: got %q, want %q", got, want)
	}
	if got, want := completions(t, nil, "pause", "--api", api.URL, "--api-key", "k1", "map"), []string{"maps"}; !slices.Equal(got, want) {
		t.Errorf("pause --api: got %q, want %q", got, want)
	}
}

func TestHelpExamples(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{args: []string{"config", "--help"}, want: "shaper config validate shaper.yaml"},
		{args: []string{"completion", "--help"}, want: "source <(shaper completion bash)"},
		{args: []string{"status", "--help"}, want: "shaper status --api http://localhost:8080"},
		{args: []string{"enqueue", "--help"}, want: "3  with --wait: the job had not finished within --wait-timeout"},
	} {
		out, errOut, code := run(t, nil, "", tc.args...)
		if code != 0 || !strings.Contains(out, tc.want) {
			t.Errorf("%v: exit %d, stdout lacks %q:\n%s%s", tc.args, code, tc.want, out, errOut)
		}
	}
}
