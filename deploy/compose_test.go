package deploy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/shaperhq/shaper/config"
	"github.com/shaperhq/shaper/internal/cli"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

const (
	composeDir  = "compose"
	composeFile = "compose/compose.yaml"
	dockerfile  = "Dockerfile"
)

// compose is the part of the Compose file format compose.yaml uses. It is
// decoded strictly, so a key compose.yaml adds must be added here too (and
// checked below), and a misspelt one fails.
type compose struct {
	Name     string                    `yaml:"name"`
	XShaper  yaml.Node                 `yaml:"x-shaper"` // the anchor the shaper services merge
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image string `yaml:"image"`
	Build *struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
		Target     string `yaml:"target"`
	} `yaml:"build"`
	Command         []string          `yaml:"command"`
	EnvFile         []string          `yaml:"env_file"`
	Environment     map[string]string `yaml:"environment"`
	Volumes         []string          `yaml:"volumes"`
	Ports           []string          `yaml:"ports"`
	ReadOnly        bool              `yaml:"read_only"`
	Restart         string            `yaml:"restart"`
	StopGracePeriod string            `yaml:"stop_grace_period"`
	DependsOn       yaml.Node         `yaml:"depends_on"`
	Healthcheck     *struct {
		Test     []string `yaml:"test"`
		Interval string   `yaml:"interval"`
		Timeout  string   `yaml:"timeout"`
		Retries  int      `yaml:"retries"`
	} `yaml:"healthcheck"`
}

func readCompose(t *testing.T) compose {
	t.Helper()
	b, err := os.ReadFile(composeFile)
	if err != nil {
		t.Fatal(err)
	}
	var c compose
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("%s: %v", composeFile, err)
	}
	if len(c.Services) == 0 {
		t.Fatalf("%s: no services", composeFile)
	}
	return c
}

// isShaper says whether a service runs the shaper image: built from the
// Dockerfile's shaper stage, or naming the image a service builds so.
func (c compose) isShaper(s composeService) bool {
	if s.Build != nil {
		return s.Build.Target == "shaper"
	}
	for _, o := range c.Services {
		if o.Build != nil && o.Build.Target == "shaper" && o.Image != "" && o.Image == s.Image {
			return true
		}
	}
	return false
}

// shaperServices are the services running the shaper image, by their
// subcommand (serve, work, ...).
func shaperServices(t *testing.T, c compose) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for name, s := range c.Services {
		if c.isShaper(s) && len(s.Command) > 0 {
			out[s.Command[0]] = append(out[s.Command[0]], name)
		}
	}
	for _, names := range out {
		slices.Sort(names)
	}
	return out
}

// composeEnv is the environment compose gives a service: its env_file
// lines, then environment.
func composeEnv(t *testing.T, s composeService) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, f := range s.EnvFile {
		b, err := os.ReadFile(filepath.Join(composeDir, f))
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("%s:%d: %q is not KEY=VALUE", f, i+1, line)
			}
			env[k] = v
		}
	}
	for k, v := range s.Environment {
		env[k] = v
	}
	return env
}

// mount is a bind mount of a host file or folder.
type mount struct{ host, container string }

// binds are a service's bind mounts, host paths resolved from deploy/
// (the test's directory); named volumes are left out.
func binds(s composeService) []mount {
	var out []mount
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || !(strings.HasPrefix(parts[0], ".") || strings.HasPrefix(parts[0], "/")) {
			continue
		}
		out = append(out, mount{host: filepath.Clean(filepath.Join(composeDir, parts[0])), container: parts[1]})
	}
	return out
}

// hostPath is the host file mounted at a container path, through a mount
// of the file itself or of a folder holding it.
func hostPath(s composeService, container string) (string, bool) {
	for _, m := range binds(s) {
		if m.container == container {
			return m.host, true
		}
		if rel, ok := strings.CutPrefix(container, m.container+"/"); ok {
			return filepath.Join(m.host, rel), true
		}
	}
	return "", false
}

// flagValue is the value of --name in args ("--name v" or "--name=v").
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// Every shaper command line compose.yaml runs is one the real command tree
// takes: a runnable subcommand, flags it has (its own or the root's), and
// the arguments it accepts. --config names a mounted file.
func TestComposeShaperCommandsAreReal(t *testing.T) {
	c := readCompose(t)
	checked := 0
	for name, s := range c.Services {
		if !c.isShaper(s) {
			continue
		}
		checked++
		if len(s.Command) == 0 {
			t.Errorf("%s: no command: the image's default is --help", name)
			continue
		}
		root := cli.NewRootCmd(&cli.Factory{In: strings.NewReader(""), Out: io.Discard, ErrOut: io.Discard,
			LookupEnv: func(string) (string, bool) { return "", false }})
		cmd, rest, err := root.Find(s.Command)
		if err != nil || cmd == root {
			t.Errorf("%s: %v is no shaper subcommand: %v", name, s.Command, err)
			continue
		}
		if !cmd.Runnable() {
			t.Errorf("%s: shaper %s does nothing by itself", name, cmd.Name())
		}
		if err := cmd.ParseFlags(rest); err != nil {
			t.Errorf("%s: shaper %v: %v", name, s.Command, err)
			continue
		}
		if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
			t.Errorf("%s: shaper %v: %v", name, s.Command, err)
		}
		if f := cmd.Flags().Lookup("log-format"); f != nil && f.Changed && f.Value.String() != "json" && f.Value.String() != "text" {
			t.Errorf("%s: --log-format %s, want json or text", name, f.Value)
		}
		// The value cobra parsed, whichever spelling gave it.
		cf := cmd.Flags().Lookup("config")
		if cf == nil || !cf.Changed {
			t.Errorf("%s: shaper %v has no --config", name, s.Command)
			continue
		}
		path := cf.Value.String()
		host, ok := hostPath(s, path)
		if !ok {
			t.Errorf("%s: --config %s is not mounted", name, path)
			continue
		}
		if _, err := os.Stat(host); err != nil {
			t.Errorf("%s: --config %s is mounted from %s: %v", name, path, host, err)
		}
	}
	got := shaperServices(t, c)
	if len(got["serve"]) != 2 || len(got["work"]) != 2 || checked != 4 {
		t.Errorf("shaper services %v, want two serve and two work", got)
	}
}

// Every file compose.yaml mounts or reads exists, every named volume is
// declared, and every build names a Dockerfile and one of its stages.
func TestComposeFilesExist(t *testing.T) {
	c := readCompose(t)
	df, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	stages := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?im)^FROM\s+.*\s+AS\s+(\S+)\s*$`).FindAllStringSubmatch(string(df), -1) {
		stages[m[1]] = true
	}
	mounts := 0
	for name, s := range c.Services {
		for _, m := range binds(s) {
			mounts++
			if _, err := os.Stat(m.host); err != nil {
				t.Errorf("%s: mounts %s: %v", name, m.host, err)
			}
			if strings.HasPrefix(m.host, "..") || filepath.IsAbs(m.host) {
				t.Errorf("%s: mounts %s, outside deploy/", name, m.host)
			}
		}
		for _, v := range s.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if !strings.HasPrefix(src, ".") && !strings.HasPrefix(src, "/") {
				if _, ok := c.Volumes[src]; !ok {
					t.Errorf("%s: named volume %s is not declared under volumes", name, src)
				}
			}
		}
		for _, f := range s.EnvFile {
			if _, err := os.Stat(filepath.Join(composeDir, f)); err != nil {
				t.Errorf("%s: env_file %s: %v", name, f, err)
			}
		}
		if s.Build != nil {
			ctx := filepath.Join(composeDir, s.Build.Context)
			if _, err := os.Stat(filepath.Join(ctx, "go.mod")); err != nil {
				t.Errorf("%s: build context %s is not the repository's root: %v", name, ctx, err)
			}
			if got, err := filepath.Abs(filepath.Join(ctx, s.Build.Dockerfile)); err != nil || got != must(filepath.Abs(dockerfile)) {
				t.Errorf("%s: dockerfile %s is not deploy/Dockerfile", name, s.Build.Dockerfile)
			}
			if !stages[s.Build.Target] {
				t.Errorf("%s: build target %q is not a stage of %s (have %v)", name, s.Build.Target, dockerfile, stages)
			}
		}
		if s.Image == "" {
			t.Errorf("%s: no image", name)
		}
	}
	if mounts < 5 {
		t.Errorf("found %d bind mounts, want the shaper config, prometheus.yml, the rules, and Grafana's provisioning and dashboard", mounts)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// Redis keeps an append-only file, so that accepted jobs survive its
// restart, on a named volume; and the shaper config points at it.
func TestComposeRedisAOF(t *testing.T) {
	c := readCompose(t)
	r, ok := c.Services["redis"]
	if !ok {
		t.Fatal("no redis service")
	}
	if i := slices.Index(r.Command, "--appendonly"); i < 0 || i+1 >= len(r.Command) || r.Command[i+1] != "yes" {
		t.Errorf("redis command %v: want --appendonly yes", r.Command)
	}
	if !slices.ContainsFunc(r.Volumes, func(v string) bool { return strings.HasSuffix(v, ":/data") }) {
		t.Errorf("redis volumes %v: want one on /data, where the AOF is written", r.Volumes)
	}
	for _, name := range shaperServices(t, c)["serve"] {
		cfg := composeConfig(t, c, name)
		u, err := url.Parse(cfg.Redis.URL)
		if err != nil || u.Hostname() != "redis" {
			t.Errorf("%s: redis.url %q, want the redis service", name, cfg.Redis.URL)
		}
	}
}

// A stop gives each shaper process its whole shutdown_timeout before
// Docker's SIGKILL (the default stop_grace_period is 10s).
func TestComposeStopGracePeriod(t *testing.T) {
	c := readCompose(t)
	for cmd, names := range shaperServices(t, c) {
		for _, name := range names {
			cfg := composeConfig(t, c, name)
			shutdown := time.Duration(cfg.API.ShutdownTimeout)
			if cmd == "work" {
				shutdown = time.Duration(cfg.Work.ShutdownTimeout)
			}
			grace := 10 * time.Second
			if g := c.Services[name].StopGracePeriod; g != "" {
				var err error
				if grace, err = time.ParseDuration(g); err != nil {
					t.Errorf("%s: stop_grace_period %q: %v", name, g, err)
					continue
				}
			}
			if grace <= shutdown {
				t.Errorf("%s: stop_grace_period %v, want above its shutdown_timeout %v", name, grace, shutdown)
			}
		}
	}
}

// composeConfig loads the shaper config a compose service runs with, in
// the environment compose gives it.
func composeConfig(t *testing.T, c compose, service string) *config.Config {
	t.Helper()
	s := c.Services[service]
	path, _ := flagValue(s.Command, "config")
	host, ok := hostPath(s, path)
	if !ok {
		t.Fatalf("%s: --config %q is not mounted", service, path)
	}
	env := composeEnv(t, s)
	cfg, err := config.Load(host, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatalf("%s: %v", service, err)
	}
	return cfg
}

// listenPort is the port of a listen address such as ":8080".
func listenPort(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil || p == "0" {
		t.Fatalf("listen address %q: want a fixed port", addr)
	}
	return p
}

// metricsPort is where a shaper service serves /metrics: api.listen for
// serve, work.metrics_listen for work, or the flag that overrides it.
func metricsPort(t *testing.T, c compose, service string) string {
	t.Helper()
	s := c.Services[service]
	cfg := composeConfig(t, c, service)
	switch s.Command[0] {
	case "serve":
		if v, ok := flagValue(s.Command, "listen"); ok {
			return listenPort(t, v)
		}
		return listenPort(t, cfg.API.Listen)
	case "work":
		if v, ok := flagValue(s.Command, "metrics-listen"); ok {
			return listenPort(t, v)
		}
		return listenPort(t, cfg.Work.MetricsListen)
	}
	t.Fatalf("%s: shaper %s serves no metrics", service, s.Command[0])
	return ""
}

// promConfig is the part of prometheus.yml the test reads.
type promConfig struct {
	Global        map[string]string `yaml:"global"`
	RuleFiles     []string          `yaml:"rule_files"`
	ScrapeConfigs []struct {
		JobName       string `yaml:"job_name"`
		StaticConfigs []struct {
			Targets []string `yaml:"targets"`
		} `yaml:"static_configs"`
	} `yaml:"scrape_configs"`
}

// Prometheus scrapes every shaper process once, on the port it serves
// /metrics on, and loads the shipped alert rules; promtool accepts the
// file as Prometheus would read it in its container.
func TestComposePrometheusScrapesEveryProcess(t *testing.T) {
	c := readCompose(t)
	p, ok := c.Services["prometheus"]
	if !ok {
		t.Fatal("no prometheus service")
	}
	const promConfigPath = "/etc/prometheus/prometheus.yml" // the image's default --config.file
	host, ok := hostPath(p, promConfigPath)
	if !ok {
		t.Fatalf("prometheus: nothing mounted at %s", promConfigPath)
	}
	b, err := os.ReadFile(host)
	if err != nil {
		t.Fatal(err)
	}
	var pc promConfig
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&pc); err != nil {
		t.Fatalf("%s: %v", host, err)
	}

	scraped := map[string]int{}
	for _, sc := range pc.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				h, port, err := net.SplitHostPort(target)
				if err != nil {
					t.Errorf("job %s: target %q: %v", sc.JobName, target, err)
					continue
				}
				s, ok := c.Services[h]
				if !ok || !c.isShaper(s) {
					t.Errorf("job %s: target %s is no shaper service", sc.JobName, target)
					continue
				}
				if want := metricsPort(t, c, h); port != want {
					t.Errorf("job %s: target %s, but %s serves /metrics on %s", sc.JobName, target, h, want)
				}
				scraped[h]++
			}
		}
	}
	for cmd, names := range shaperServices(t, c) {
		for _, n := range names {
			if scraped[n] != 1 {
				t.Errorf("shaper %s service %s is scraped %d times, want once", cmd, n, scraped[n])
			}
		}
	}

	// The rules, resolved as Prometheus does: relative to the config's
	// folder, in the container.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if len(pc.RuleFiles) == 0 {
		t.Error("prometheus.yml loads no rule files")
	}
	for _, rf := range pc.RuleFiles {
		in := rf
		if !filepath.IsAbs(in) {
			in = filepath.Join(filepath.Dir(promConfigPath), rf)
		}
		src, ok := hostPath(p, in)
		if !ok {
			t.Errorf("rule file %s (%s in the container) is not mounted", rf, in)
			continue
		}
		if filepath.Clean(src) != filepath.Clean(rulesFile) {
			t.Errorf("rule file %s is %s, want the shipped %s", rf, src, rulesFile)
		}
		if filepath.IsAbs(rf) {
			t.Errorf("rule file %s: keep it relative, so that promtool can check the config here", rf)
			continue
		}
		rb, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, rf), rb, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(promtool(t), "check", "config", filepath.Join(dir, "prometheus.yml")).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
}

// grafanaProvisioning is the part of Grafana's provisioning files the
// test reads (datasources and dashboards alike).
type grafanaProvisioning struct {
	APIVersion  int `yaml:"apiVersion"`
	Datasources []struct {
		Name      string `yaml:"name"`
		UID       string `yaml:"uid"`
		Type      string `yaml:"type"`
		Access    string `yaml:"access"`
		URL       string `yaml:"url"`
		IsDefault bool   `yaml:"isDefault"`
		Editable  bool   `yaml:"editable"`
	} `yaml:"datasources"`
	Providers []struct {
		Name            string `yaml:"name"`
		Folder          string `yaml:"folder"`
		Type            string `yaml:"type"`
		DisableDeletion bool   `yaml:"disableDeletion"`
		AllowUIUpdates  bool   `yaml:"allowUiUpdates"`
		Options         struct {
			Path                      string `yaml:"path"`
			FoldersFromFilesStructure bool   `yaml:"foldersFromFilesStructure"`
		} `yaml:"options"`
	} `yaml:"providers"`
}

// provisioning reads every provisioning file Grafana finds in one of its
// provisioning folders.
func provisioning(t *testing.T, s composeService, kind string) []grafanaProvisioning {
	t.Helper()
	dir, ok := hostPath(s, "/etc/grafana/provisioning/"+kind)
	if !ok {
		t.Fatalf("grafana: nothing mounted at /etc/grafana/provisioning/%s", kind)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("grafana: no provisioning file in %s (%v)", dir, err)
	}
	var out []grafanaProvisioning
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var g grafanaProvisioning
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		if err := dec.Decode(&g); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if g.APIVersion != 1 {
			t.Errorf("%s: apiVersion %d, want 1", f, g.APIVersion)
		}
		out = append(out, g)
	}
	return out
}

// Grafana gets the compose Prometheus as its default data source (of the
// type the dashboard's $datasource variable lists) and loads the shipped
// dashboard from where compose mounts it.
func TestComposeGrafanaProvisionsDashboard(t *testing.T) {
	c := readCompose(t)
	g, ok := c.Services["grafana"]
	if !ok {
		t.Fatal("no grafana service")
	}
	d := readDashboard(t)
	var dsType string
	for _, v := range d.Templating.List {
		if v.Name == "datasource" {
			dsType, _ = v.Query.(string)
		}
	}
	defaults := 0
	for _, p := range provisioning(t, g, "datasources") {
		for _, ds := range p.Datasources {
			if ds.IsDefault {
				defaults++
			}
			if ds.Type != dsType {
				t.Errorf("data source %s is of type %s; the dashboard's $datasource lists %q", ds.Name, ds.Type, dsType)
			}
			u, err := url.Parse(ds.URL)
			if err != nil {
				t.Errorf("data source %s: %v", ds.Name, err)
				continue
			}
			if _, ok := c.Services[u.Hostname()]; !ok || u.Hostname() != "prometheus" || u.Port() != "9090" {
				t.Errorf("data source %s: url %s, want the prometheus service on 9090", ds.Name, ds.URL)
			}
		}
	}
	if defaults != 1 {
		t.Errorf("%d default data sources, want 1", defaults)
	}
	loaded := false
	for _, p := range provisioning(t, g, "dashboards") {
		for _, pr := range p.Providers {
			if pr.Type != "file" {
				t.Errorf("dashboard provider %s: type %q, want file", pr.Name, pr.Type)
				continue
			}
			// The dashboard file mounted into the provider's folder, or a
			// folder holding it mounted as the provider's.
			for _, m := range binds(g) {
				if filepath.Dir(m.container) == pr.Options.Path && filepath.Clean(m.host) == filepath.Clean(dashboardFile) {
					loaded = true
				}
			}
			if src, ok := hostPath(g, pr.Options.Path); ok && filepath.Clean(src) == filepath.Dir(filepath.Clean(dashboardFile)) {
				loaded = true
			}
		}
	}
	if !loaded {
		t.Errorf("no dashboard provider's folder holds the mounted %s", dashboardFile)
	}
	if home, ok := g.Environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]; ok {
		if src, ok := hostPath(g, home); !ok || filepath.Clean(src) != filepath.Clean(dashboardFile) {
			t.Errorf("Grafana's home dashboard %s is not the mounted %s", home, dashboardFile)
		}
	}
}

// The demo upstream's service runs examples/thirdparty with flags it
// takes, on the port the shaper config's base_url names: built and started
// here with compose's arguments (on a free port), it must answer.
func TestComposeDemoUpstreamRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds examples/thirdparty; skipped under -short")
	}
	c := readCompose(t)
	s, ok := c.Services["thirdparty"]
	if !ok {
		t.Fatal("no thirdparty service")
	}
	if s.Build == nil || s.Build.Target != "thirdparty" {
		t.Fatalf("thirdparty: build %+v, want the Dockerfile's thirdparty target", s.Build)
	}
	df, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(df), "./examples/thirdparty/cmd/thirdparty") {
		t.Fatalf("%s does not build ./examples/thirdparty/cmd/thirdparty", dockerfile)
	}
	listen, ok := singleDashFlag(s.Command, "listen")
	if !ok {
		t.Fatalf("thirdparty: command %v has no -listen", s.Command)
	}
	for _, name := range shaperServices(t, c)["work"] {
		for up, u := range composeConfig(t, c, name).Upstreams {
			if u.Handler {
				continue
			}
			bu, err := url.Parse(u.BaseURL)
			if err != nil {
				t.Fatal(err)
			}
			if bu.Hostname() == "thirdparty" && bu.Port() != listenPort(t, listen) {
				t.Errorf("%s: upstream %s's base_url %s, but thirdparty listens on %s", name, up, u.BaseURL, listen)
			}
		}
	}

	bin := filepath.Join(t.TempDir(), "thirdparty")
	if out, err := exec.Command("go", "build", "-o", bin, "../examples/thirdparty/cmd/thirdparty").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	args := slices.Clone(s.Command)
	for i, a := range args {
		if (a == "-listen" || a == "--listen") && i+1 < len(args) {
			args[i+1] = "127.0.0.1:0"
		}
	}
	cmd := exec.Command(bin, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	first := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		first <- line
		io.Copy(io.Discard, stdout)
	}()
	var line string
	select {
	case line = <-first:
	case <-time.After(30 * time.Second):
		t.Fatalf("thirdparty %v printed nothing in 30s; stderr:\n%s", args, stderr.String())
	}
	m := regexp.MustCompile(`listening on (http://\S+)`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("thirdparty %v: first line %q, want listening on ...; stderr:\n%s", args, line, stderr.String())
	}
	resp, err := http.Get(m[1] + "/_thirdparty/report")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /_thirdparty/report: %s", resp.Status)
	}
}

// singleDashFlag is the value of a Go flag package flag (-name v, -name=v,
// or with two dashes).
func singleDashFlag(args []string, name string) (string, bool) {
	for i, a := range args {
		a = "-" + strings.TrimLeft(a, "-")
		if a == "-"+name && i+1 < len(args) {
			return args[i+1], true
		}
		if v, ok := strings.CutPrefix(a, "-"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// The shaper services' commands run for real, with the environment compose
// gives them and the config they mount: each starts, and answers /healthz,
// /readyz and /metrics on the port Prometheus scrapes. Only the Redis
// address and the listen addresses are changed, to the test's.
func TestComposeShaperServicesStart(t *testing.T) {
	c := readCompose(t)
	rs := redistest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // before run's clean-ups, which wait for the commands to end
	var names []string
	for _, ns := range shaperServices(t, c) {
		names = append(names, ns...)
	}
	slices.Sort(names)
	// Each service gets its own environment and nothing else: not another
	// service's, nor a variable of the developer's that the config reads.
	var clear []byte // what clearConfigEnv reads: the configs, and KEY= of every env
	for _, name := range names {
		s := c.Services[name]
		for k := range composeEnv(t, s) {
			clear = fmt.Appendf(clear, "${%s}\n", k)
		}
		for _, m := range binds(s) {
			if b, err := os.ReadFile(m.host); err == nil {
				clear = append(clear, b...)
			}
		}
	}
	for _, name := range names {
		s := c.Services[name]
		cmdName := s.Command[0]
		clearConfigEnv(t, clear)
		for k, v := range composeEnv(t, s) {
			t.Setenv(k, v)
		}
		args := slices.Clone(s.Command)
		path, _ := flagValue(args, "config")
		host, _ := hostPath(s, path)
		for i := range args {
			if args[i] == path {
				args[i] = host
			}
		}
		addr := freeAddr(t)
		switch cmdName {
		case "serve":
			args = append(args, "--listen", addr)
		case "work":
			args = append(args, "--metrics-listen", addr)
		default:
			t.Fatalf("%s: shaper %s: not a service this test knows", name, cmdName)
		}
		args = append(args, "--redis", rs.URL())
		log := run(t, ctx, args...)
		// The process has read its environment once it answers.
		for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
			waitFor(t, 30*time.Second, fmt.Sprintf("%s to answer %s", name, p), func() bool { return get("http://"+addr+p) == nil }, log)
		}
	}
	if len(names) != 4 {
		t.Errorf("ran %v, want two serve and two work", names)
	}
}

// `docker compose config` checks the file against Compose's own schema,
// where the Compose plugin is installed (it may not be; Docker's daemon is
// not needed).
func TestDockerComposeConfig(t *testing.T) {
	docker, err := exec.LookPath("docker")
	if err != nil {
		t.Skip("docker not found")
	}
	if err := exec.Command(docker, "compose", "version").Run(); err != nil {
		t.Skip("docker compose is not installed")
	}
	out, err := exec.Command(docker, "compose", "-f", composeFile, "config", "--quiet").CombinedOutput()
	if err != nil {
		t.Fatalf("docker compose config: %v\n%s", err, out)
	}
}
