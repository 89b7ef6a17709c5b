package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigValidateExamplesRun runs each line of `config validate --help`'s
// examples that names a file shipped in the repository exactly as written
// (its VAR=value prefixes as the environment, nothing else set), and holds
// it to exit status 0: an example a new user copies must work.
func TestConfigValidateExamplesRun(t *testing.T) {
	cmd, _, err := NewRootCmd(&Factory{}).Find([]string{"config", "validate"})
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, line := range strings.Split(cmd.Example, "\n") {
		env := map[string]string{}
		fields := strings.Fields(line)
		for len(fields) > 0 && strings.Contains(fields[0], "=") {
			k, v, _ := strings.Cut(fields[0], "=")
			env[k] = v
			fields = fields[1:]
		}
		if len(fields) < 2 || fields[0] != "shaper" {
			t.Fatalf("example %q: want a shaper command line", line)
		}
		args := fields[1:]
		shipped := false
		for i, a := range args {
			// The test runs in internal/cli; examples are written from the
			// repository's root.
			if p := filepath.Join("..", "..", a); strings.Contains(a, "/") && fileExists(p) {
				args[i], shipped = p, true
			}
		}
		if !shipped {
			continue // a user's own file, such as shaper.yaml
		}
		ran++
		if out, errOut, code := run(t, env, "", args...); code != 0 {
			t.Errorf("example %q: got exit %d, want 0\nstdout: %s\nstderr: %s", line, code, out, errOut)
		}
	}
	if ran == 0 {
		t.Fatal("no example names a shipped file: the test checks nothing")
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
