package config

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/shaperhq/shaper"
)

// maxNodes bounds the nodes decoded, counting every expansion of an alias,
// so that a few lines of nested aliases cannot make the decoder do
// exponential work.
const maxNodes = 100_000

// decoder turns a YAML node tree into a Config by the yaml struct tags.
// yaml.v3's own strict decoding (KnownFields) names a typo as "field limts
// not found in type config.Upstream" rather than by its path, cannot
// suggest the key that was meant, and has no hook to expand ${ENV} in
// scalar values only — expanding the text before parsing would let a
// variable's value add keys.
type decoder struct {
	env    func(string) (string, bool)
	ps     *problems
	budget int
	// expanding holds the anchors being decoded, to catch an alias to its
	// own ancestor.
	expanding map[*yaml.Node]bool
	exhausted bool
}

func (d *decoder) decode(n *yaml.Node, path string, v reflect.Value) {
	if !d.charge(n, path, 1) {
		return
	}
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil || d.expanding[n.Alias] {
			d.fail(n, path, "alias *%s refers to a value that contains it", n.Value)
			return
		}
		d.expanding[n.Alias] = true
		d.decode(n.Alias, path, v)
		delete(d.expanding, n.Alias)
		return
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		// An empty or null value leaves the field at its zero value, which
		// is to say its default; it does not count as written.
		return
	}
	if path != "" {
		d.ps.lines[path] = n.Line
	}
	switch v.Type() {
	case reflect.TypeFor[Duration]():
		if s, ok := d.scalar(n, path, "a duration such as 1s"); ok {
			dur, err := parseDuration(s)
			if err != nil {
				d.fail(n, path, "%s", d.quoteFrom(n, s, err))
				return
			}
			v.SetInt(int64(dur))
		}
		return
	case reflect.TypeFor[shaper.OnRedisError]():
		if s, ok := d.scalar(n, path, "allow, deny or local"); ok {
			p, err := shaper.ParseOnRedisError(s)
			if err != nil || s == "" {
				d.fail(n, path, "%q is not a policy (want allow, deny or local)", s)
				return
			}
			v.SetInt(int64(p))
		}
		return
	}
	switch v.Kind() {
	case reflect.String:
		if s, ok := d.scalar(n, path, "a string"); ok {
			v.SetString(s)
		}
	case reflect.Bool:
		if s, ok := d.scalar(n, path, "true or false"); ok {
			switch s {
			case "true", "True", "TRUE":
				v.SetBool(true)
			case "false", "False", "FALSE":
				v.SetBool(false)
			default:
				d.fail(n, path, "%q is not true or false", s)
			}
		}
	case reflect.Int, reflect.Int64:
		if s, ok := d.scalar(n, path, "a whole number"); ok {
			i, err := parseInt(s, v.Type().Bits())
			if err != nil {
				d.fail(n, path, "%s", d.quoteFrom(n, s, err))
				return
			}
			v.SetInt(i)
		}
	case reflect.Float64:
		if s, ok := d.scalar(n, path, "a number"); ok {
			f, err := strconv.ParseFloat(strings.ReplaceAll(s, "_", ""), 64)
			if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
				d.fail(n, path, "%s", d.quoteFrom(n, s, fmt.Errorf("%q is not a number", s)))
				return
			}
			v.SetFloat(f)
		}
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		d.decode(n, path, v.Elem())
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.fail(n, path, "want a list, got %s", describe(n))
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			d.decode(item, index(path, i), s.Index(i))
		}
		v.Set(s)
	case reflect.Map:
		d.decodeMap(n, path, v)
	case reflect.Struct:
		d.decodeStruct(n, path, v)
	default:
		panic(fmt.Sprintf("config: no decoding for %v", v.Type()))
	}
}

// charge takes cost from the node budget, reporting once when it runs out.
func (d *decoder) charge(n *yaml.Node, path string, cost int) bool {
	if d.exhausted {
		return false
	}
	if d.budget -= cost; d.budget < 0 {
		d.exhausted = true
		d.ps.addAt(n.Line, path, "too many values once aliases are expanded (at most %d)", maxNodes)
		return false
	}
	return true
}

// scalar expands ${ENV} in a scalar's value; the value of a variable is
// never parsed as YAML, which is what keeps it from adding keys.
func (d *decoder) scalar(n *yaml.Node, path, want string) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		d.fail(n, path, "want %s, got %s", want, describe(n))
		return "", false
	}
	s, err := expand(n.Value, d.env)
	if err != nil {
		d.fail(n, path, "%v", err)
		return "", false
	}
	return s, true
}

// quoteFrom shows where an expanded value came from, since "abc is not a
// whole number" is puzzling when the file says ${RATE}.
func (d *decoder) quoteFrom(n *yaml.Node, expanded string, err error) string {
	if expanded == n.Value {
		return err.Error()
	}
	return fmt.Sprintf("%v (from %s)", err, n.Value)
}

func (d *decoder) fail(n *yaml.Node, path, format string, args ...any) {
	d.ps.broken[path] = true
	d.ps.addAt(n.Line, path, format, args...)
}

// pair is one key and value of a mapping, merge keys resolved.
type pair struct {
	key, value *yaml.Node
}

// pairs lists a mapping's entries with YAML merge keys (<<: *base) applied:
// keys written in the mapping win over merged ones, and earlier merged
// mappings win over later ones. A key written twice is an error rather
// than the last one silently winning.
func (d *decoder) pairs(n *yaml.Node, path string) []pair {
	if !d.charge(n, path, len(n.Content)/2) {
		return nil
	}
	var own, merged []pair
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.fail(k, path, "keys must be plain strings, got %s", describe(k))
			continue
		}
		if k.Tag == "!!merge" {
			merged = append(merged, d.mergeSources(val, path)...)
			continue
		}
		if line, dup := seen[k.Value]; dup {
			d.ps.addAt(k.Line, join(path, k.Value), "written twice (also on line %d)", line)
			continue
		}
		seen[k.Value] = k.Line
		own = append(own, pair{k, val})
	}
	for _, p := range merged {
		if _, dup := seen[p.key.Value]; dup {
			continue
		}
		seen[p.key.Value] = p.key.Line
		own = append(own, p)
	}
	return own
}

func (d *decoder) mergeSources(val *yaml.Node, path string) []pair {
	if !d.charge(val, path, 1) {
		return nil
	}
	switch {
	case val.Kind == yaml.AliasNode && val.Alias != nil && !d.expanding[val.Alias]:
		d.expanding[val.Alias] = true
		defer delete(d.expanding, val.Alias)
		return d.mergeSources(val.Alias, path)
	case val.Kind == yaml.MappingNode:
		return d.pairs(val, path)
	case val.Kind == yaml.SequenceNode:
		var out []pair
		for _, item := range val.Content {
			if item.Kind == yaml.SequenceNode {
				d.fail(item, path, "<< merges mappings, got a list inside its list")
				continue
			}
			out = append(out, d.mergeSources(item, path)...)
		}
		return out
	}
	d.fail(val, path, "<< merges a mapping or a list of mappings, got %s", describe(val))
	return nil
}

func (d *decoder) decodeMap(n *yaml.Node, path string, v reflect.Value) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, "want a mapping, got %s", describe(n))
		return
	}
	m := reflect.MakeMap(v.Type())
	for _, p := range d.pairs(n, path) {
		elem := reflect.New(v.Type().Elem()).Elem()
		d.decode(p.value, join(path, p.key.Value), elem)
		m.SetMapIndex(reflect.ValueOf(p.key.Value), elem)
	}
	v.Set(m)
}

func (d *decoder) decodeStruct(n *yaml.Node, path string, v reflect.Value) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, "want a mapping with %s, got %s", strings.Join(keysOf(v.Type()), ", "), describe(n))
		return
	}
	for _, p := range d.pairs(n, path) {
		name := p.key.Value
		i := fieldIndex(v.Type(), name)
		if i < 0 {
			// Top-level x- keys are the usual home of YAML anchors.
			if path == "" && strings.HasPrefix(name, "x-") {
				continue
			}
			if why, ok := removedKey(join(path, name)); ok {
				d.ps.addAt(p.key.Line, join(path, name), "%s", why)
				continue
			}
			d.ps.addAt(p.key.Line, join(path, name), "%s", unknownKey(name, keysOf(v.Type())))
			continue
		}
		d.decode(p.value, join(path, name), v.Field(i))
	}
}

func fieldIndex(t reflect.Type, name string) int {
	for i := range t.NumField() {
		if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); tag == name && tag != "-" {
			return i
		}
	}
	return -1
}

func keysOf(t reflect.Type) []string {
	var keys []string
	for i := range t.NumField() {
		if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); tag != "" && tag != "-" {
			keys = append(keys, tag)
		}
	}
	return keys
}

// removedKey says why a key that an earlier version of shaper read is
// refused now, and what to do instead: a key accepted and ignored would
// let a config claim a setting that nothing applies.
func removedKey(path string) (string, bool) {
	switch path {
	case "work.max_hold":
		return "removed in 0.1.0: workers take no job they cannot send within work.horizon, so none is held; delete the line", true
	}
	return "", false
}

// unknownKey suggests the known key a typo most likely meant, or lists
// them all when none is close.
func unknownKey(name string, known []string) string {
	best, bestDist := "", math.MaxInt
	for _, k := range known {
		if squash(k) == squash(name) {
			return fmt.Sprintf("unknown key; did you mean %q?", k)
		}
		if dist := editDistance(strings.ToLower(name), k); dist < bestDist {
			best, bestDist = k, dist
		}
	}
	if bestDist <= 2 && bestDist < len(name)/2+1 {
		return fmt.Sprintf("unknown key; did you mean %q?", best)
	}
	sorted := slices.Sorted(slices.Values(known))
	return fmt.Sprintf("unknown key (allowed: %s)", strings.Join(sorted, ", "))
}

// squash folds the spellings baseURL, base-url and BaseUrl together.
func squash(s string) string {
	return strings.ToLower(strings.NewReplacer("_", "", "-", "").Replace(s))
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.DocumentNode:
		return "a document"
	}
	return fmt.Sprintf("%q", n.Value)
}

// parseInt reads a whole number: 1000, 1_000_000, or 1e6 (an integral
// float), as people write limits.
func parseInt(s string, bits int) (int64, error) {
	clean := strings.ReplaceAll(s, "_", "")
	i, err := strconv.ParseInt(clean, 10, bits)
	if err == nil {
		return i, nil
	}
	if errors.Is(err, strconv.ErrRange) {
		return 0, fmt.Errorf("%s is too large", s)
	}
	f, ferr := strconv.ParseFloat(clean, 64)
	switch {
	case ferr != nil || math.IsNaN(f) || math.IsInf(f, 0):
		return 0, fmt.Errorf("%q is not a whole number", s)
	case f != math.Trunc(f):
		return 0, fmt.Errorf("%s is not a whole number", s)
	case math.Abs(f) >= math.Ldexp(1, bits-1) || math.Abs(f) > 1<<53:
		return 0, fmt.Errorf("%s is too large", s)
	}
	return int64(f), nil
}

func atoi(s string) int {
	i, _ := strconv.Atoi(s)
	return i
}

func trimYAML(msg string) string { return strings.TrimPrefix(msg, "yaml: ") }
