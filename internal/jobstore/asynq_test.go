package jobstore

import (
	"os"
	"runtime/debug"
	"strings"
	"testing"
)

func TestCheckAsynq(t *testing.T) {
	other := &debug.Module{Path: "github.com/redis/go-redis/v9", Version: "v9.23.0"}
	asynq := func(version string, replace *debug.Module) *debug.Module {
		return &debug.Module{Path: AsynqModule, Version: version, Replace: replace}
	}
	for _, tc := range []struct {
		name string
		deps []*debug.Module
		want string // "" for accepted, else in the error
	}{
		{"known", []*debug.Module{other, asynq("v0.26.0", nil)}, ""},
		{"newer", []*debug.Module{asynq("v0.27.0", nil), other}, "links github.com/hibiken/asynq v0.27.0, but shaper's store knows the Redis layout of asynq v0.26.0 only"},
		{"older", []*debug.Module{asynq("v0.25.1", nil)}, "go get github.com/hibiken/asynq@v0.26.0"},
		{"pseudo-version", []*debug.Module{asynq("v0.26.1-0.20261101000000-0123456789ab", nil)}, "asynq v0.26.1-0.20261101000000-0123456789ab"},
		{"replaced by a fork at a known version", []*debug.Module{asynq("v0.27.0", &debug.Module{Path: "github.com/acme/asynq", Version: "v0.26.0"})}, ""},
		{"replaced by a fork at an unknown version", []*debug.Module{asynq("v0.26.0", &debug.Module{Path: "github.com/acme/asynq", Version: "v0.26.3"})},
			"links github.com/hibiken/asynq v0.26.0 => github.com/acme/asynq v0.26.3"},
		{"replaced by a directory, required known", []*debug.Module{asynq("v0.26.0", &debug.Module{Path: "../asynq"})}, ""},
		{"replaced by a directory, required unknown", []*debug.Module{asynq("v0.27.0", &debug.Module{Path: "../asynq"})},
			"links github.com/hibiken/asynq v0.27.0 => ../asynq, but"},
		{"not linked", []*debug.Module{other}, ""},
		{"no deps", nil, ""},
		{"nil entry", []*debug.Module{nil, asynq("v0.26.0", nil)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckAsynq(tc.deps)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("got %v, want accepted", err)
			case tc.want != "" && err == nil:
				t.Errorf("got accepted, want an error with %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Errorf("got %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

// The asynq go.mod requires, which the layout tests (keys_test.go,
// message_test.go) run against, must be one this package knows: a bump of
// asynq in go.mod fails here until knownAsynq says the new layout was
// checked. (A test binary's build info lists no deps, so go.mod is read.)
func TestGoModAsynqIsKnown(t *testing.T) {
	b, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	var version string
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(f) >= 2 && f[0] == AsynqModule {
			version = f[1]
		}
	}
	if version == "" {
		t.Fatalf("go.mod requires no %s", AsynqModule)
	}
	if err := CheckAsynq([]*debug.Module{{Path: AsynqModule, Version: version}}); err != nil {
		t.Error(err)
	}
	// Nor may the running build refuse itself, whatever its build info holds.
	if err := CheckBuild(); err != nil {
		t.Error(err)
	}
}
