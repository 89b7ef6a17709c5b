package jobstore

import (
	"io/fs"
	"strings"
	"testing"
)

// TestLuaFilesStateTheirContract holds every file of lua/ to the house
// rule: it opens with a comment naming it, and a script (not a library of
// functions) lists what it returns.
func TestLuaFilesStateTheirContract(t *testing.T) {
	libs := map[string]bool{"callback.lua": true, "calls.lua": true, "count.lua": true, "flow.lua": true, "forward.lua": true, "optional.lua": true, "partmarks.lua": true, "remember.lua": true, "trim.lua": true}
	names, err := fs.Glob(luaFiles, "lua/*.lua")
	if err != nil || len(names) == 0 {
		t.Fatalf("got %d files (%v), want the scripts", len(names), err)
	}
	for _, path := range names {
		name := strings.TrimPrefix(path, "lua/")
		src := lua(name)
		if !strings.HasPrefix(src, "-- "+name) {
			t.Errorf("%s opens with %.40q, want a comment naming it", name, src)
		}
		var head strings.Builder
		for _, line := range strings.Split(src, "\n") {
			if !strings.HasPrefix(line, "--") {
				break
			}
			head.WriteString(line + "\n")
		}
		if libs[name] {
			if !strings.Contains(head.String(), "library") {
				t.Errorf("%s: a library's opening comment must say so and what it defines", name)
			}
			continue
		}
		if !strings.Contains(head.String(), "Returns") {
			t.Errorf("%s: the opening comment says nothing of what it returns", name)
		}
		if strings.Contains(src, "KEYS[") && !strings.Contains(head.String(), "KEYS[1] ->") {
			t.Errorf("%s uses KEYS but its opening comment lists none as KEYS[i] ->", name)
		}
	}
}
