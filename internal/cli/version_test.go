package cli

import (
	"runtime"
	"strings"
	"testing"

	"github.com/shaperhq/shaper/metrics"
)

func TestVersionLine(t *testing.T) {
	platform := runtime.GOOS + "/" + runtime.GOARCH
	for _, tc := range []struct {
		name                                 string
		ldflags, module, revision, goversion string
		want                                 string
	}{
		{name: "release build", ldflags: "v1.2.3", module: "v1.2.0", revision: "0a1b2c3", goversion: "go1.24.1",
			want: "shaper v1.2.3 (revision 0a1b2c3, go1.24.1, " + platform + ")"},
		{name: "go install", ldflags: "dev", module: "v0.9.0", revision: "0a1b2c3-dirty", goversion: "go1.24.1",
			want: "shaper v0.9.0 (revision 0a1b2c3-dirty, go1.24.1, " + platform + ")"},
		{name: "local build", ldflags: "dev", module: "unknown", revision: "unknown", goversion: "go1.24.1",
			want: "shaper dev (revision unknown, go1.24.1, " + platform + ")"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := versionLine(tc.ldflags, tc.module, tc.revision, tc.goversion); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestVersionCommand: the command prints what the build info says, the
// same values shaper_build_info carries.
func TestVersionCommand(t *testing.T) {
	version, revision, goversion := metrics.Build()
	out, errOut, code := run(t, nil, "", "version")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want := versionLine(Version, version, revision, goversion) + "\n"
	if out != want {
		t.Errorf("got %q, want %q", out, want)
	}
	if !strings.Contains(out, "revision "+revision+",") || !strings.Contains(out, goversion) {
		t.Errorf("got %q, want revision %s and %s", out, revision, goversion)
	}
	out, _, _ = run(t, nil, "", "--version")
	if want := "shaper version " + shownVersion(Version, version) + "\n"; out != want {
		t.Errorf("--version: got %q, want %q", out, want)
	}
}
