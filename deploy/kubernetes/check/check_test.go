package check

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

const (
	baseDir       = "../base"
	secretExample = "../secret.example.yaml"
)

// kustomization is the part of kustomize's Kustomization the base uses.
// It is decoded strictly, so a key the base adds must be added here too,
// and a misspelt one fails.
type kustomization struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Labels     []struct {
		Pairs            map[string]string `json:"pairs"`
		IncludeSelectors bool              `json:"includeSelectors"`
	} `json:"labels"`
	Resources          []string `json:"resources"`
	ConfigMapGenerator []struct {
		Name  string   `json:"name"`
		Files []string `json:"files"`
	} `json:"configMapGenerator"`
	Images []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
	} `json:"images"`
}

// base is the kustomize base, decoded.
type base struct {
	k           kustomization
	deployments map[string]*appsv1.Deployment // by the shaper command they run: serve, work
	services    []*corev1.Service
	pdbs        []*policyv1.PodDisruptionBudget
	config      shaperConfig
	configFile  string // the generator's file name, as mounted
	configMap   string // the generator's ConfigMap name
}

// decodeStrict decodes one manifest into obj: unknown and duplicate fields
// are errors, and the apiVersion and kind must be the ones given.
func decodeStrict(b []byte, apiVersion, kind string, obj any) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(b, &tm); err != nil {
		return err
	}
	if tm.APIVersion != apiVersion || tm.Kind != kind {
		return fmt.Errorf("%s %s, want %s %s", tm.APIVersion, tm.Kind, apiVersion, kind)
	}
	return yaml.UnmarshalStrict(b, obj)
}

// kindOf reads a manifest's apiVersion and kind.
func kindOf(b []byte) (string, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(b, &tm); err != nil {
		return "", err
	}
	return tm.APIVersion + " " + tm.Kind, nil
}

// decodeObject decodes a manifest strictly into the Kubernetes type of its
// kind; a kind the base has no business shipping is an error.
func decodeObject(b []byte) (any, error) {
	k, err := kindOf(b)
	if err != nil {
		return nil, err
	}
	var obj any
	switch k {
	case "apps/v1 Deployment":
		obj = &appsv1.Deployment{}
	case "v1 Service":
		obj = &corev1.Service{}
	case "policy/v1 PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	case "v1 ConfigMap":
		obj = &corev1.ConfigMap{}
	default:
		return nil, fmt.Errorf("unexpected kind %q", k)
	}
	if err := yaml.UnmarshalStrict(b, obj); err != nil {
		return nil, err
	}
	return obj, nil
}

// shaperCommand is the shaper subcommand a Deployment runs: its first arg.
func shaperCommand(d *appsv1.Deployment) string {
	c := shaperContainer(d)
	if c == nil || len(c.Args) == 0 {
		return ""
	}
	return c.Args[0]
}

// shaperContainer is the Deployment's container named shaper.
func shaperContainer(d *appsv1.Deployment) *corev1.Container {
	for i := range d.Spec.Template.Spec.Containers {
		if c := &d.Spec.Template.Spec.Containers[i]; c.Name == "shaper" {
			return c
		}
	}
	return nil
}

func loadBase(t *testing.T) *base {
	t.Helper()
	var b base
	kb, err := os.ReadFile(filepath.Join(baseDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := decodeStrict(kb, "kustomize.config.k8s.io/v1beta1", "Kustomization", &b.k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	b.deployments = map[string]*appsv1.Deployment{}
	for _, r := range b.k.Resources {
		mb, err := os.ReadFile(filepath.Join(baseDir, r))
		if err != nil {
			t.Errorf("kustomization.yaml lists %s: %v", r, err)
			continue
		}
		obj, err := decodeObject(mb)
		if err != nil {
			t.Errorf("%s: %v", r, err)
			continue
		}
		switch o := obj.(type) {
		case *appsv1.Deployment:
			cmd := shaperCommand(o)
			if cmd != "serve" && cmd != "work" {
				t.Errorf("%s: Deployment %s runs shaper %q, want serve or work", r, o.Name, cmd)
				continue
			}
			if b.deployments[cmd] != nil {
				t.Errorf("%s: a second Deployment of shaper %s", r, cmd)
			}
			b.deployments[cmd] = o
		case *corev1.Service:
			b.services = append(b.services, o)
		case *policyv1.PodDisruptionBudget:
			b.pdbs = append(b.pdbs, o)
		default:
			t.Errorf("%s: a %T belongs in a generator, not in resources", r, o)
		}
	}
	if len(b.k.ConfigMapGenerator) != 1 || len(b.k.ConfigMapGenerator[0].Files) != 1 {
		t.Fatalf("configMapGenerator %+v: want one ConfigMap of one file (the shaper config)", b.k.ConfigMapGenerator)
	}
	b.configMap = b.k.ConfigMapGenerator[0].Name
	b.configFile = b.k.ConfigMapGenerator[0].Files[0]
	b.config = readConfig(t, filepath.Join(baseDir, b.configFile))
	if t.Failed() {
		t.FailNow()
	}
	for _, cmd := range []string{"serve", "work"} {
		if b.deployments[cmd] == nil {
			t.Fatalf("no Deployment runs shaper %s", cmd)
		}
	}
	return &b
}

// Every YAML file in the base is either listed or generated from, so that
// none is shipped and silently left out of what kustomize builds.
func TestKustomizationListsEveryFile(t *testing.T) {
	b := loadBase(t)
	used := append(slices.Clone(b.k.Resources), "kustomization.yaml", b.configFile)
	files, err := filepath.Glob(filepath.Join(baseDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !slices.Contains(used, filepath.Base(f)) {
			t.Errorf("%s is in the base but not in kustomization.yaml", f)
		}
	}
	if len(b.k.Images) != 1 {
		t.Fatalf("images %+v: want one, the shaper image", b.k.Images)
	}
	for cmd, d := range b.deployments {
		if img := shaperContainer(d).Image; img != b.k.Images[0].Name {
			t.Errorf("%s: image %q is not the kustomization's image %q, so an overlay's images: would not reach it", cmd, img, b.k.Images[0].Name)
		}
	}
}

// shaperConfig is what the manifests must agree with in the shipped shaper
// config.
type shaperConfig struct {
	apiListen, metricsListen  string
	apiShutdown, workShutdown time.Duration
	keyEnvs                   []string // api.keys' key_env
	vars                      []string // ${NAME} without a default, anywhere
	raw                       map[string]any
}

var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(:-[^}]*)?\}`)

// readConfig reads the parts of a shaper config the manifests depend on,
// with shaper's defaults (docs/config.md) for keys left out.
func readConfig(t *testing.T, path string) shaperConfig {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	c := shaperConfig{apiListen: ":8080", metricsListen: ":9091", apiShutdown: 30 * time.Second, workShutdown: 30 * time.Second}
	if err := yaml.Unmarshal(b, &c.raw); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	section := func(name string) map[string]any {
		m, _ := c.raw[name].(map[string]any)
		return m
	}
	str := func(m map[string]any, key string, into *string) {
		if v, ok := m[key]; ok {
			s, ok := v.(string)
			if !ok {
				t.Errorf("%s: %s is %v, want a string", path, key, v)
			}
			*into = s
		}
	}
	dur := func(m map[string]any, key string, into *time.Duration) {
		var s string
		str(m, key, &s)
		if s == "" {
			return
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Errorf("%s: %s %q: %v", path, key, s, err)
		}
		*into = d
	}
	api, work := section("api"), section("work")
	str(api, "listen", &c.apiListen)
	str(work, "metrics_listen", &c.metricsListen)
	dur(api, "shutdown_timeout", &c.apiShutdown)
	dur(work, "shutdown_timeout", &c.workShutdown)
	keys, _ := api["keys"].([]any)
	for _, k := range keys {
		if m, ok := k.(map[string]any); ok {
			if e, ok := m["key_env"].(string); ok {
				c.keyEnvs = append(c.keyEnvs, e)
			}
		}
	}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		case string:
			for _, m := range envRef.FindAllStringSubmatch(v, -1) {
				if m[2] == "" && !slices.Contains(c.vars, m[1]) {
					c.vars = append(c.vars, m[1])
				}
			}
		}
	}
	walk(c.raw)
	sort.Strings(c.vars)
	return c
}

// port is the port of a listen address such as ":8080".
func port(t *testing.T, addr string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("listen address %q: %v", addr, err)
	}
	n, err := strconv.ParseInt(p, 10, 32)
	if err != nil || n == 0 {
		t.Fatalf("listen address %q: want a fixed port for the probes", addr)
	}
	return int32(n)
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

// processPort is the port the shaper process in d listens on for its
// probes and metrics: the flag's when the args override the config.
func processPort(t *testing.T, b *base, cmd string) int32 {
	t.Helper()
	args := shaperContainer(b.deployments[cmd]).Args
	switch cmd {
	case "serve":
		if v, ok := flagValue(args, "listen"); ok {
			return port(t, v)
		}
		return port(t, b.config.apiListen)
	default:
		if v, ok := flagValue(args, "metrics-listen"); ok {
			return port(t, v)
		}
		return port(t, b.config.metricsListen)
	}
}

// containerPort resolves a probe's or a Service's port (a number or a
// container port's name) to a number.
func containerPort(c *corev1.Container, p intstr.IntOrString) (int32, bool) {
	if p.Type == intstr.Int {
		return p.IntVal, true
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

// The probes ask the shaper process on the port it really listens on (the
// config's, or the flag's), at the paths both serve and work answer:
// /healthz (alive) for liveness, /readyz (Redis answers) for readiness.
// deploy/kubernetes_test.go asks a running serve and work those paths. The
// prometheus.io/port annotation names the same port.
func TestProbesReachTheProcess(t *testing.T) {
	b := loadBase(t)
	for _, cmd := range []string{"serve", "work"} {
		c := shaperContainer(b.deployments[cmd])
		want := processPort(t, b, cmd)
		declared := false
		for _, cp := range c.Ports {
			declared = declared || cp.ContainerPort == want
		}
		if !declared {
			t.Errorf("%s: no container port %d, where the process listens", cmd, want)
		}
		// The annotation-driven scrape asks the same port.
		if a, ok := b.deployments[cmd].Spec.Template.Annotations["prometheus.io/port"]; ok && a != strconv.Itoa(int(want)) {
			t.Errorf("%s: prometheus.io/port %s, want %d where /metrics is served", cmd, a, want)
		}
		for _, p := range []struct {
			kind  string
			probe *corev1.Probe
			path  string
		}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
			if p.probe == nil || p.probe.HTTPGet == nil {
				t.Errorf("%s: no HTTP %s probe", cmd, p.kind)
				continue
			}
			g := p.probe.HTTPGet
			if g.Path != p.path {
				t.Errorf("%s: %s probe asks %s, want %s", cmd, p.kind, g.Path, p.path)
			}
			got, ok := containerPort(c, g.Port)
			if !ok {
				t.Errorf("%s: %s probe's port %s names no container port", cmd, p.kind, g.Port.String())
			} else if got != want {
				t.Errorf("%s: %s probe on port %d, want %d (where the process listens)", cmd, p.kind, got, want)
			}
			if p.probe.TimeoutSeconds < 1 || p.probe.PeriodSeconds < 1 {
				t.Errorf("%s: %s probe: timeout %ds period %ds, want both set", cmd, p.kind, p.probe.TimeoutSeconds, p.probe.PeriodSeconds)
			}
		}
	}
}

// A pod's grace period covers its preStop pause and then the whole
// shutdown_timeout of its process: otherwise the kubelet's SIGKILL cuts
// requests in flight short, and a worker's jobs wait out their lease
// instead of going straight back to the queue.
func TestGracePeriodAboveShutdownTimeout(t *testing.T) {
	b := loadBase(t)
	for cmd, shutdown := range map[string]time.Duration{"serve": b.config.apiShutdown, "work": b.config.workShutdown} {
		d := b.deployments[cmd]
		grace := d.Spec.Template.Spec.TerminationGracePeriodSeconds
		if grace == nil {
			t.Errorf("%s: no terminationGracePeriodSeconds (the default 30s is not above a 30s shutdown_timeout)", cmd)
			continue
		}
		var pause time.Duration
		if lc := shaperContainer(d).Lifecycle; lc != nil && lc.PreStop != nil {
			switch {
			case lc.PreStop.Sleep != nil:
				pause = time.Duration(lc.PreStop.Sleep.Seconds) * time.Second
			default:
				t.Errorf("%s: preStop %+v: the image has no shell, want a sleep action", cmd, lc.PreStop)
			}
		}
		if got, want := time.Duration(*grace)*time.Second, pause+shutdown; got <= want {
			t.Errorf("%s: terminationGracePeriodSeconds %v, want above preStop %v + shutdown_timeout %v", cmd, got, pause, shutdown)
		}
	}
}

func TestPodsRunAsNonRootReadOnly(t *testing.T) {
	b := loadBase(t)
	for cmd, d := range b.deployments {
		ps := d.Spec.Template.Spec
		if sc := ps.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			t.Errorf("%s: pod securityContext.runAsNonRoot is not true", cmd)
		} else if sc.RunAsUser == nil || *sc.RunAsUser == 0 {
			t.Errorf("%s: runAsUser %v, want a numeric non-root user (the image's is 65532)", cmd, sc.RunAsUser)
		}
		if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
			t.Errorf("%s: automountServiceAccountToken is not false: shaper never calls the Kubernetes API", cmd)
		}
		for _, c := range ps.Containers {
			sc := c.SecurityContext
			switch {
			case sc == nil:
				t.Errorf("%s/%s: no container securityContext", cmd, c.Name)
			case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
				t.Errorf("%s/%s: readOnlyRootFilesystem is not true", cmd, c.Name)
			case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
				t.Errorf("%s/%s: allowPrivilegeEscalation is not false", cmd, c.Name)
			case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL"):
				t.Errorf("%s/%s: capabilities do not drop ALL", cmd, c.Name)
			}
		}
	}
}

// Requests let the scheduler place pods; a memory limit bounds a leak. CPU
// has no limit on purpose (a throttled worker misses its send slots), so it
// is not required here.
func TestResources(t *testing.T) {
	b := loadBase(t)
	for cmd, d := range b.deployments {
		for _, c := range d.Spec.Template.Spec.Containers {
			req, lim := c.Resources.Requests, c.Resources.Limits
			for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				if q, ok := req[r]; !ok || q.IsZero() {
					t.Errorf("%s/%s: no %s request", cmd, c.Name, r)
				}
			}
			m, ok := lim[corev1.ResourceMemory]
			if !ok {
				t.Errorf("%s/%s: no memory limit", cmd, c.Name)
				continue
			}
			if rm := req[corev1.ResourceMemory]; m.Cmp(rm) < 0 {
				t.Errorf("%s/%s: memory limit %s below its request %s", cmd, c.Name, m.String(), rm.String())
			}
		}
	}
}

// selects reports whether sel picks the pods of d.
func selects(t *testing.T, sel *metav1.LabelSelector, d *appsv1.Deployment) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatal(err)
	}
	if s.Empty() {
		t.Fatalf("selector %v selects everything", sel)
	}
	return s.Matches(labels.Set(d.Spec.Template.Labels))
}

// Each Deployment's selector picks its own pods and not the other's (both
// are shaper, told apart by component).
func TestDeploymentSelectors(t *testing.T) {
	b := loadBase(t)
	for cmd, d := range b.deployments {
		for other, o := range b.deployments {
			if got := selects(t, d.Spec.Selector, o); got != (cmd == other) {
				t.Errorf("Deployment %s's selector picks %s's pods: %v, want %v", d.Name, other, got, cmd == other)
			}
		}
	}
}

// Every Deployment has exactly one PDB, whose selector picks its pods and
// no other's, and which lets a drain evict at least one of its replicas.
func TestPodDisruptionBudgets(t *testing.T) {
	b := loadBase(t)
	covered := map[string]int{}
	for _, p := range b.pdbs {
		var picks []string
		for cmd, d := range b.deployments {
			if selects(t, p.Spec.Selector, d) {
				picks = append(picks, cmd)
			}
		}
		if len(picks) != 1 {
			t.Errorf("PDB %s selects the pods of %v, want exactly one Deployment's", p.Name, picks)
			continue
		}
		d := b.deployments[picks[0]]
		covered[picks[0]]++
		replicas := int32(1)
		if d.Spec.Replicas != nil {
			replicas = *d.Spec.Replicas
		}
		switch {
		case p.Spec.MinAvailable != nil && p.Spec.MaxUnavailable != nil:
			t.Errorf("PDB %s sets both minAvailable and maxUnavailable", p.Name)
		case p.Spec.MinAvailable != nil:
			if p.Spec.MinAvailable.Type != intstr.Int || p.Spec.MinAvailable.IntVal >= replicas || p.Spec.MinAvailable.IntVal < 1 {
				t.Errorf("PDB %s: minAvailable %s with %d replicas: want a number from 1 to replicas-1, so a drain can evict one and never all", p.Name, p.Spec.MinAvailable.String(), replicas)
			}
		case p.Spec.MaxUnavailable != nil:
			if p.Spec.MaxUnavailable.Type != intstr.Int || p.Spec.MaxUnavailable.IntVal < 1 || p.Spec.MaxUnavailable.IntVal >= replicas {
				t.Errorf("PDB %s: maxUnavailable %s with %d replicas: want a number from 1 to replicas-1", p.Name, p.Spec.MaxUnavailable.String(), replicas)
			}
		default:
			t.Errorf("PDB %s sets neither minAvailable nor maxUnavailable", p.Name)
		}
	}
	for cmd := range b.deployments {
		if covered[cmd] != 1 {
			t.Errorf("Deployment of %s has %d PDBs, want 1", cmd, covered[cmd])
		}
	}
}

// The serve Service picks serve's pods only and sends to the API's port;
// the work one gives each worker's metrics port.
func TestServices(t *testing.T) {
	b := loadBase(t)
	want := map[string]int32{"serve": processPort(t, b, "serve"), "work": processPort(t, b, "work")}
	found := map[string]bool{}
	for _, s := range b.services {
		sel := &metav1.LabelSelector{MatchLabels: s.Spec.Selector}
		var picks []string
		for cmd, d := range b.deployments {
			if selects(t, sel, d) {
				picks = append(picks, cmd)
			}
		}
		if len(picks) != 1 {
			t.Errorf("Service %s selects the pods of %v, want exactly one Deployment's", s.Name, picks)
			continue
		}
		cmd := picks[0]
		found[cmd] = true
		c := shaperContainer(b.deployments[cmd])
		for _, p := range s.Spec.Ports {
			target := p.TargetPort
			if target.Type == intstr.Int && target.IntVal == 0 {
				target = intstr.FromInt32(p.Port)
			}
			got, ok := containerPort(c, target)
			if !ok {
				t.Errorf("Service %s port %s: targetPort %s names no container port of %s", s.Name, p.Name, target.String(), cmd)
			} else if got != want[cmd] {
				t.Errorf("Service %s port %s: targets %d, want %d where shaper %s listens", s.Name, p.Name, got, want[cmd], cmd)
			}
		}
	}
	if !found["serve"] {
		t.Error("no Service selects serve")
	}
}

// The config reaches the process: --config names a file of the generated
// ConfigMap, mounted read-only.
func TestConfigMounted(t *testing.T) {
	b := loadBase(t)
	for cmd, d := range b.deployments {
		c := shaperContainer(d)
		path, ok := flagValue(c.Args, "config")
		if !ok {
			t.Errorf("%s: args %v have no --config", cmd, c.Args)
			continue
		}
		var mount *corev1.VolumeMount
		for i, m := range c.VolumeMounts {
			if filepath.Dir(path) == m.MountPath {
				mount = &c.VolumeMounts[i]
			}
		}
		if mount == nil {
			t.Errorf("%s: --config %s is in no mounted volume", cmd, path)
			continue
		}
		if !mount.ReadOnly {
			t.Errorf("%s: config volume mounted writable", cmd)
		}
		if filepath.Base(path) != b.configFile {
			t.Errorf("%s: --config %s, but the ConfigMap's file is %s", cmd, path, b.configFile)
		}
		var vol *corev1.Volume
		for i, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == mount.Name {
				vol = &d.Spec.Template.Spec.Volumes[i]
			}
		}
		if vol == nil || vol.ConfigMap == nil || vol.ConfigMap.Name != b.configMap {
			t.Errorf("%s: volume %s is not the generated ConfigMap %s: %+v", cmd, mount.Name, b.configMap, vol)
		}
	}
}

// Every secret the config reads from the environment comes from the Secret
// both Deployments load (envFrom), and the example Secret has each of them:
// the API keys' key_env and every ${NAME} without a default. Both
// processes read the whole config, so both need all of them.
func TestSecretsFromEnvironment(t *testing.T) {
	b := loadBase(t)
	sb, err := os.ReadFile(secretExample)
	if err != nil {
		t.Fatal(err)
	}
	var s corev1.Secret
	if err := decodeStrict(sb, "v1", "Secret", &s); err != nil {
		t.Fatalf("%s: %v", secretExample, err)
	}
	for _, v := range append(slices.Clone(b.config.keyEnvs), b.config.vars...) {
		if _, ok := s.StringData[v]; !ok {
			t.Errorf("%s has no %s, which %s reads from the environment", secretExample, v, b.configFile)
		}
	}
	if len(b.config.vars) == 0 || len(b.config.keyEnvs) == 0 {
		t.Errorf("config reads keys %v and variables %v from the environment, want both: the base shows how", b.config.keyEnvs, b.config.vars)
	}
	for cmd, d := range b.deployments {
		c := shaperContainer(d)
		from := false
		for _, e := range c.EnvFrom {
			if e.SecretRef != nil && e.SecretRef.Name == s.Name && (e.SecretRef.Optional == nil || !*e.SecretRef.Optional) {
				from = true
			}
		}
		if !from {
			t.Errorf("%s: does not load the Secret %s (envFrom, not optional)", cmd, s.Name)
		}
		for _, e := range c.Env {
			if e.Value != "" && (slices.Contains(b.config.keyEnvs, e.Name) || slices.Contains(b.config.vars, e.Name)) {
				t.Errorf("%s: env %s has a literal value in the manifest; secrets come from the Secret", cmd, e.Name)
			}
		}
	}
}

// splitDocs splits a multi-document YAML stream.
func splitDocs(b []byte) [][]byte {
	var out [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		if strings.TrimSpace(d) != "" {
			out = append(out, []byte(d))
		}
	}
	return out
}

// What kustomize itself builds from the base, when kubectl is at hand (it
// may not be on CI): every object decodes strictly, and the generated
// ConfigMap, renamed with its content hash, is the one both Deployments
// mount, holding the shipped config.
func TestKubectlKustomize(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not found; the manifests are still checked file by file")
	}
	var stderr bytes.Buffer
	cmd := exec.Command(kubectl, "kustomize", baseDir)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", baseDir, err, stderr.String())
	}
	want, err := os.ReadFile(filepath.Join(baseDir, "shaper.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cmName string
	var mounted []string
	kinds := map[string]int{}
	for _, doc := range splitDocs(out) {
		obj, err := decodeObject(doc)
		if err != nil {
			t.Errorf("kustomize output: %v\n%s", err, doc)
			continue
		}
		switch o := obj.(type) {
		case *corev1.ConfigMap:
			kinds["ConfigMap"]++
			cmName = o.Name
			if o.Data["shaper.yaml"] != string(want) {
				t.Errorf("ConfigMap %s: shaper.yaml differs from the base's file", o.Name)
			}
		case *appsv1.Deployment:
			kinds["Deployment"]++
			for _, v := range o.Spec.Template.Spec.Volumes {
				if v.ConfigMap != nil {
					mounted = append(mounted, v.ConfigMap.Name)
				}
			}
			if o.Labels["app.kubernetes.io/part-of"] != "shaper" {
				t.Errorf("Deployment %s: labels %v lack the kustomization's part-of", o.Name, o.Labels)
			}
		case *corev1.Service:
			kinds["Service"]++
		case *policyv1.PodDisruptionBudget:
			kinds["PodDisruptionBudget"]++
		}
	}
	if want := map[string]int{"ConfigMap": 1, "Deployment": 2, "Service": 2, "PodDisruptionBudget": 2}; fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Errorf("kustomize built %v, want %v", kinds, want)
	}
	if !strings.HasPrefix(cmName, "shaper-config-") {
		t.Errorf("generated ConfigMap %q: want shaper-config-<hash>", cmName)
	}
	if len(mounted) != 2 || mounted[0] != cmName || mounted[1] != cmName {
		t.Errorf("Deployments mount ConfigMaps %v, want both %s", mounted, cmName)
	}
}
