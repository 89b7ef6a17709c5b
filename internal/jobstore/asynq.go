package jobstore

import (
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
)

// AsynqModule is the module whose Redis layout this package rebuilds.
const AsynqModule = "github.com/hibiken/asynq"

// knownAsynq lists the asynq versions whose key layout and task message
// this package writes exactly as asynq does (keys_test.go and
// message_test.go hold it to the version in go.mod). A new asynq version
// joins the list only after those tests pass against it and its layout has
// been read for changes they do not cover.
func knownAsynq() []string { return []string{"v0.26.0"} }

// CheckAsynq refuses a build that links an asynq version whose layout this
// package does not know: shaper would then write Redis keys and task
// messages that the linked asynq (its Inspector, and the tools built on it)
// reads differently. deps is a build's module list (debug.BuildInfo.Deps).
// A replaced module is judged by its replacement's version, or by the
// required version when it is replaced by a directory, which has none.
// Without asynq among deps there is nothing to check.
func CheckAsynq(deps []*debug.Module) error {
	for _, m := range deps {
		if m == nil || m.Path != AsynqModule {
			continue
		}
		version, what := m.Version, m.Path+" "+m.Version
		if r := m.Replace; r != nil {
			if r.Version != "" {
				version = r.Version
			}
			what += " => " + strings.TrimSpace(r.Path+" "+r.Version)
		}
		known := knownAsynq()
		if slices.Contains(known, version) {
			return nil
		}
		return fmt.Errorf("this binary links %s, but shaper's store knows the Redis layout of asynq %s only; "+
			"build it with %s %s (go get %s@%s), or use a shaper release whose CHANGELOG.md lists asynq %s",
			what, strings.Join(known, ", "), AsynqModule, known[len(known)-1], AsynqModule, known[len(known)-1], version)
	}
	return nil
}

// CheckBuild is CheckAsynq on the running binary's build info. A binary
// without build info has nothing to check.
func CheckBuild() error {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return nil
	}
	return CheckAsynq(bi.Deps)
}
