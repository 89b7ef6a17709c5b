package deploy

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

// The Kubernetes manifests are decoded strictly into Kubernetes' own types
// by the module in kubernetes/check; here the processes they describe run.

const (
	kubeBase          = "kubernetes/base"
	kubeSecretExample = "kubernetes/secret.example.yaml"
)

// secretExampleEnv is the environment the example Secret gives the pods.
func secretExampleEnv(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(kubeSecretExample)
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		StringData map[string]string `yaml:"stringData"`
	}
	if err := yaml.Unmarshal(b, &s); err != nil {
		t.Fatalf("%s: %v", kubeSecretExample, err)
	}
	if len(s.StringData) == 0 {
		t.Fatalf("%s: no stringData", kubeSecretExample)
	}
	return s.StringData
}

// kubeDeployment is the part of a Deployment this test runs.
type kubeDeployment struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		Template struct {
			Spec struct {
				Containers []struct {
					Name  string   `yaml:"name"`
					Args  []string `yaml:"args"`
					Ports []struct {
						Name          string `yaml:"name"`
						ContainerPort int    `yaml:"containerPort"`
					} `yaml:"ports"`
					LivenessProbe  *kubeProbe `yaml:"livenessProbe"`
					ReadinessProbe *kubeProbe `yaml:"readinessProbe"`
					VolumeMounts   []struct {
						MountPath string `yaml:"mountPath"`
					} `yaml:"volumeMounts"`
				} `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type kubeProbe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
	} `yaml:"httpGet"`
}

// TestKubernetesProbesAnswer runs each Deployment's shaper command line
// with the base's config and the example Secret's environment (Redis and
// the listen addresses changed to the test's), and asks it every path its
// probes ask: each must answer 200. Which port the probes use is checked
// against the config in kubernetes/check.
func TestKubernetesProbesAnswer(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(kubeBase, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rs := redistest.New(t)
	cfg, err := os.ReadFile(filepath.Join(kubeBase, "shaper.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	clearConfigEnv(t, cfg)
	env := secretExampleEnv(t)
	env["REDIS_URL"] = rs.URL()
	for k, v := range env {
		t.Setenv(k, v)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // before run's clean-ups, which wait for the commands to end
	ran := map[string]int{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d kubeDeployment
		if err := yaml.NewDecoder(bytes.NewReader(b)).Decode(&d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if d.Kind != "Deployment" {
			continue
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			if c.Name != "shaper" || len(c.Args) == 0 {
				continue
			}
			args := slices.Clone(c.Args)
			path, ok := flagValue(args, "config")
			if !ok {
				t.Fatalf("%s: args %v have no --config", f, args)
			}
			for i := range args {
				if args[i] == path {
					// The ConfigMap's file, as the generator takes it.
					args[i] = filepath.Join(kubeBase, filepath.Base(path))
				}
			}
			addr := freeAddr(t)
			switch args[0] {
			case "serve":
				args = append(args, "--listen", addr)
			case "work":
				args = append(args, "--metrics-listen", addr)
			default:
				t.Fatalf("%s: shaper %s has no probe port this test knows", f, args[0])
			}
			ran[args[0]]++
			log := run(t, ctx, args...)
			var paths []string
			for _, p := range []*kubeProbe{c.LivenessProbe, c.ReadinessProbe} {
				if p == nil || p.HTTPGet == nil {
					t.Errorf("%s: a probe that is not an HTTP GET", f)
					continue
				}
				paths = append(paths, p.HTTPGet.Path)
			}
			for _, p := range paths {
				waitFor(t, 30*time.Second, fmt.Sprintf("%s (shaper %s) to answer its probe %s", d.Metadata.Name, args[0], p),
					func() bool { return get("http://"+addr+p) == nil }, log)
			}
		}
	}
	if ran["serve"] != 1 || ran["work"] != 1 {
		t.Errorf("ran %v from the base's Deployments, want one serve and one work", ran)
	}
}
