package config

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Problem is one thing wrong with a config.
type Problem struct {
	// Path names the field at fault the way it is written in YAML, e.g.
	// "upstreams.stripe.limits[0].rate". Empty for the document itself.
	Path string
	// Line is where the field is in the file; 0 when the config was not
	// read from YAML or the field is missing from it.
	Line int
	// Msg says what is wrong and, in parentheses, what is allowed.
	Msg string
}

// String renders the problem as "line 12: upstreams.stripe.limts: unknown key".
func (p Problem) String() string { return p.format("") }

func (p Problem) format(file string) string {
	var b strings.Builder
	switch {
	case file != "" && p.Line > 0:
		fmt.Fprintf(&b, "%s:%d: ", file, p.Line)
	case file != "":
		b.WriteString(file + ": ")
	case p.Line > 0:
		fmt.Fprintf(&b, "line %d: ", p.Line)
	}
	if p.Path != "" {
		b.WriteString(p.Path + ": ")
	}
	b.WriteString(p.Msg)
	return b.String()
}

// Error is an invalid config: every problem found, in file order, so that
// one run of `shaper config validate` shows them all.
type Error struct {
	// File is the config's path when it was read with Load.
	File     string
	Problems []Problem
}

func (e *Error) Error() string {
	if len(e.Problems) == 1 {
		return "invalid config: " + e.Problems[0].format(e.File)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "invalid config (%d problems):", len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n  " + p.format(e.File))
	}
	return b.String()
}

// problems collects what is wrong while decoding and validating, so that a
// config with several mistakes is reported in one go.
type problems struct {
	list []Problem
	// lines maps a field's path to the line it was read from.
	lines map[string]int
	// broken holds paths whose value could not be decoded; checks on them
	// (or on what contains them) would only repeat the decoding problem.
	broken map[string]bool
}

func newProblems() *problems {
	return &problems{lines: map[string]int{}, broken: map[string]bool{}}
}

func (ps *problems) add(path, format string, args ...any) {
	ps.list = append(ps.list, Problem{Path: path, Line: ps.line(path), Msg: fmt.Sprintf(format, args...)})
}

// addAt records a problem with a known line, for decoding where the node
// is at hand.
func (ps *problems) addAt(line int, path, format string, args ...any) {
	ps.list = append(ps.list, Problem{Path: path, Line: line, Msg: fmt.Sprintf(format, args...)})
}

// line finds the line of path or, when it was not in the file, of the
// nearest enclosing field that was.
func (ps *problems) line(path string) int {
	for path != "" {
		if l, ok := ps.lines[path]; ok {
			return l
		}
		path = parent(path)
	}
	return 0
}

// isBroken reports whether path, or anything inside it, failed to decode.
func (ps *problems) isBroken(path string) bool {
	for b := range ps.broken {
		if b == path || strings.HasPrefix(b, path+".") || strings.HasPrefix(b, path+"[") {
			return true
		}
	}
	return false
}

func (ps *problems) err(file string) error {
	if len(ps.list) == 0 {
		return nil
	}
	list := slices.Clone(ps.list)
	slices.SortStableFunc(list, func(a, b Problem) int { return cmp.Compare(a.Line, b.Line) })
	return &Error{File: file, Problems: list}
}

// parent strips the last element of a path: "a.b[0]" → "a.b", `a["x.y"]` → "a".
func parent(path string) string {
	if strings.HasSuffix(path, `"]`) {
		if i := strings.LastIndex(path, `["`); i >= 0 {
			return path[:i]
		}
	}
	if strings.HasSuffix(path, "]") {
		if i := strings.LastIndex(path, "["); i >= 0 {
			return path[:i]
		}
	}
	if i := strings.LastIndex(path, "."); i >= 0 {
		return path[:i]
	}
	return ""
}

// join appends a mapping key to a path, quoting keys that would make the
// path ambiguous (upstream names are checked later, but the path to report
// that must already be readable).
func join(path, key string) string {
	if key == "" || !plainKey.MatchString(key) {
		return path + "[" + strconv.Quote(key) + "]"
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

func index(path string, i int) string { return fmt.Sprintf("%s[%d]", path, i) }
