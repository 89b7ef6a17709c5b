package script

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// TestLazyBuildsOnlyWhenLoaded: a library made lazy is built when its
// loader runs, not before (a part that raises as it is built raises only
// then), and the loader returns the functions it exports, which see the
// script's own functions defined before it.
func TestLazyBuildsOnlyWhenLoaded(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	lib := Lazy("load_twice", []string{"twice", "stamp"}, `
if ARGV[1] == 'raise' then error('built') end
local function twice(n) return 2 * n end
local function stamp() return shaper_int(1e15) end
`)
	for _, c := range []struct {
		body, arg, want, err string
	}{
		{"return 'unused'", "raise", "unused", ""},
		{"local twice, stamp = load_twice() return {twice(21), stamp()}", "", "[42 1000000000000000]", ""},
		{"local twice = load_twice() return twice(1)", "raise", "", "built"},
	} {
		v, err := Run(ctx, rdb, "lazy", New(lib, c.body), []string{"k"}, c.arg)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: got %v, %v; want an error %q", c.body, v, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		if got := fmt.Sprint(v); got != c.want {
			t.Errorf("%s: got %s, want %s", c.body, got, c.want)
		}
	}
}
