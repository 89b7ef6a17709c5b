package config

import (
	"fmt"
	"strings"
)

// expand replaces ${NAME} and ${NAME:-default} in one scalar value and
// turns $$ into $. Every other $ is an error rather than a literal, so that
// a $NAME written by habit is not silently sent to an upstream as text.
// The result is never expanded again: a variable's value is data.
func expand(s string, lookup func(string) (string, bool)) (string, error) {
	if !strings.Contains(s, "$") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '$' {
			b.WriteByte(c)
			continue
		}
		if i+1 < len(s) && s[i+1] == '$' {
			b.WriteByte('$')
			i++
			continue
		}
		if i+1 >= len(s) || s[i+1] != '{' {
			rest := s[i:]
			if m := bareVar.FindString(rest); m != "" {
				return "", fmt.Errorf("%s: write ${%s} to use the variable, or $$ for a literal $", m, m[1:])
			}
			return "", fmt.Errorf("a lone $ (write $$ for a literal $, or ${NAME} for a variable)")
		}
		end := strings.IndexByte(s[i+2:], '}')
		if end < 0 {
			return "", fmt.Errorf("%q has no closing } (write ${NAME} or ${NAME:-default})", s[i:])
		}
		body := s[i+2 : i+2+end]
		name, def, hasDef := strings.Cut(body, ":-")
		if !envName.MatchString(name) {
			return "", fmt.Errorf("${%s}: %q is not a variable name (letters, digits and _, not starting with a digit; default with ${NAME:-default})", body, name)
		}
		v, ok := lookup(name)
		switch {
		case hasDef && v == "":
			v = def
		case !ok:
			return "", fmt.Errorf("environment variable %s is not set (set it, or write ${%s:-default})", name, name)
		}
		b.WriteString(v)
		i += 2 + end
	}
	return b.String(), nil
}
