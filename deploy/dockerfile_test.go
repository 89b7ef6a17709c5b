package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/shaperhq/shaper/internal/cli"
)

// Docker is not available here, so the Dockerfile is read as text: its
// instructions, one per logical line.
type instruction struct {
	cmd  string // upper case: FROM, RUN, ...
	args string
}

func readDockerfile(t *testing.T) []instruction {
	t.Helper()
	b, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	var out []instruction
	var cur strings.Builder
	for _, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		if s, ok := strings.CutSuffix(trimmed, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(trimmed)
		if f := strings.Fields(cur.String()); len(f) > 0 {
			out = append(out, instruction{cmd: strings.ToUpper(f[0]), args: strings.TrimSpace(strings.TrimPrefix(cur.String(), f[0]))})
		}
		cur.Reset()
	}
	return out
}

// stage is the instructions of one FROM.
type stage struct {
	name, image string
	ins         []instruction
}

func stages(ins []instruction) []stage {
	var out []stage
	from := regexp.MustCompile(`^(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$`)
	for _, in := range ins {
		if in.cmd == "FROM" {
			m := from.FindStringSubmatch(in.args)
			if m == nil {
				m = []string{"", in.args, ""}
			}
			out = append(out, stage{image: m[1], name: m[2]})
			continue
		}
		if len(out) > 0 {
			out[len(out)-1].ins = append(out[len(out)-1].ins, in)
		}
	}
	return out
}

// The image a plain `docker build` makes is shaper's: static base, a
// numeric non-root user, the binary as entrypoint.
func TestDockerfileFinalImage(t *testing.T) {
	st := stages(readDockerfile(t))
	if len(st) < 2 {
		t.Fatalf("%d stages, want a build stage and the image", len(st))
	}
	final := st[len(st)-1]
	if final.name != "shaper" {
		t.Errorf("last stage %q, want shaper (the default target)", final.name)
	}
	if !strings.HasPrefix(final.image, "gcr.io/distroless/static") && final.image != "scratch" {
		t.Errorf("final image from %s, want distroless static or scratch", final.image)
	}
	var user, entry, copied string
	for _, in := range final.ins {
		switch in.cmd {
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			var e []string
			if err := json.Unmarshal([]byte(in.args), &e); err != nil || len(e) != 1 {
				t.Errorf("ENTRYPOINT %s: want the exec form with the binary alone", in.args)
				continue
			}
			entry = e[0]
		case "COPY":
			if f := strings.Fields(in.args); len(f) == 3 && strings.HasPrefix(f[0], "--from=") {
				copied = f[2]
			}
		}
	}
	uid, gid, _ := strings.Cut(user, ":")
	for _, id := range []string{uid, gid} {
		if n, err := strconv.Atoi(id); err != nil || n == 0 {
			t.Errorf("USER %q: want numeric non-root uid:gid, so that runAsNonRoot can check it", user)
		}
	}
	if filepath.Base(entry) != "shaper" || entry != copied {
		t.Errorf("ENTRYPOINT %q, copied binary %q: want the shaper binary copied from the build stage", entry, copied)
	}
}

// The Dockerfile's go build line, dry-run here (go build -n) as the build
// stage runs it, its cache mounts dropped: its flags, environment and
// packages are real. A full cgo-free -trimpath build would rebuild the
// standard library (minutes on a cold cache), so the properties it buys
// are checked from the line itself: CGO_ENABLED=0 (nothing to link
// against libc, so static), -trimpath, and a -X naming the variable
// `shaper version` reports (a wrong name is silently ignored by the
// linker, so the name is compared with the real one, which this file
// refers to so that renaming it breaks the build here).
func TestDockerfileBuildLine(t *testing.T) {
	var run string
	for _, in := range readDockerfile(t) {
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
			run = in.args
		}
	}
	if run == "" {
		t.Fatal("no RUN with go build")
	}
	_ = cli.Version // the variable the -X below must name
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X github.com/shaperhq/shaper/internal/cli.Version=${VERSION}", "./cmd/shaper", "./examples/thirdparty/cmd/thirdparty"} {
		if !strings.Contains(run, want) {
			t.Errorf("build line lacks %s: %s", want, run)
		}
	}
	out := t.TempDir()
	script := regexp.MustCompile(`--mount=\S+\s*`).ReplaceAllString(run, "")
	script = strings.ReplaceAll(script, "/out/", out+"/")
	script = strings.ReplaceAll(script, "go build ", "go build -n ")
	cmd := exec.Command("sh", "-ec", script)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "TARGETOS="+runtime.GOOS, "TARGETARCH="+runtime.GOARCH, "VERSION=v0.0.0-dockerfile-test")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, b)
	}
}

// The build context's ignore file leaves out .git and nothing the image's
// builds need: every Go file, embedded file, go.mod and go.sum of the
// packages shaper and thirdparty are built from.
func TestDockerignoreKeepsWhatTheBuildNeeds(t *testing.T) {
	b, err := os.ReadFile(dockerfile + ".dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "!") || strings.Contains(line, "**") {
			t.Fatalf("pattern %q: this test reads plain patterns only", line)
		}
		patterns = append(patterns, filepath.Clean(line))
	}
	// ignored is Docker's rule for plain patterns: a path is left out when
	// a pattern matches it or a folder above it.
	ignored := func(path string) bool {
		for p := path; p != "." && p != "/"; p = filepath.Dir(p) {
			for _, pat := range patterns {
				if ok, _ := filepath.Match(pat, p); ok {
					return true
				}
			}
		}
		return false
	}
	if !ignored(".git") {
		t.Error(".git is in the build context")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-deps", "-f",
		`{{if .Module}}{{if .Module.Main}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{range .EmbedFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{end}}{{end}}`,
		"./cmd/shaper", "./examples/thirdparty/cmd/thirdparty")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	needed := append(strings.Fields(string(out)), filepath.Join(root, "go.mod"), filepath.Join(root, "go.sum"))
	if len(needed) < 20 {
		t.Fatalf("go list found %d files the build needs, want many: %v", len(needed), needed)
	}
	for _, f := range needed {
		rel, err := filepath.Rel(root, f)
		if err != nil {
			t.Fatal(err)
		}
		if ignored(rel) {
			t.Errorf("%s is needed by the build but left out of its context", rel)
		}
	}
}
