// Command docgen writes shaper's generated references under docs/: one page
// per command of the CLI (docs/cli/, from the cobra tree), every config key
// (docs/config.md, from the config package's types, comments and defaults)
// and every metric (docs/metrics.md, from package metrics' definitions). Run
// it from anywhere in the repository after changing any of those:
//
//	go run ./internal/docgen
//
// Its test fails, naming the stale page, when docs/ no longer matches.
package main

//go:generate go run .

import (
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "docgen: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	pages, err := generate(root)
	if err != nil {
		return err
	}
	// A command that went away leaves no page behind.
	old, err := filepath.Glob(filepath.Join(root, cliDir, "*.md"))
	if err != nil {
		return err
	}
	for _, p := range old {
		rel, _ := filepath.Rel(root, p)
		if _, ok := pages[filepath.ToSlash(rel)]; !ok {
			if err := os.Remove(p); err != nil {
				return err
			}
		}
	}
	for rel, data := range pages {
		p := filepath.Join(root, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// moduleRoot is the nearest directory at or above the working one that
// holds shaper's go.mod, so that go generate (run in this package's
// directory) and go run from the root write to the same place.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "config", "config.go")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no shaper module root above the working directory")
		}
		dir = parent
	}
}

// generate returns every generated page by its slash-separated path under
// the module root.
func generate(root string) (map[string][]byte, error) {
	pages, err := cliPages()
	if err != nil {
		return nil, fmt.Errorf("cli reference: %w", err)
	}
	cfg, err := configPage(filepath.Join(root, "config"))
	if err != nil {
		return nil, fmt.Errorf("config reference: %w", err)
	}
	pages["docs/config.md"] = cfg
	m, err := metricsPage()
	if err != nil {
		return nil, fmt.Errorf("metrics reference: %w", err)
	}
	pages["docs/metrics.md"] = m
	return pages, nil
}
