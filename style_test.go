package shaper

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoPackageVars holds these packages to STYLE.md's rule 3: a
// package-level variable is mutable state every caller shares, so the only
// ones allowed are values built once and never changed: Lua scripts,
// sentinel errors and compiled patterns. A fixed list is a function or a
// switch instead.
func TestNoPackageVars(t *testing.T) {
	allowed := map[string]bool{"errors.New": true, "regexp.MustCompile": true, "script.New": true, "redis.NewScript": true}
	for _, dir := range []string{".", "queue", "dispatcher", "server", "status", "config", "schedule"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			t.Fatalf("no Go files in %s: the test checks nothing", dir)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			fs := token.NewFileSet()
			f, err := parser.ParseFile(fs, path, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, decl := range f.Decls {
				g, ok := decl.(*ast.GenDecl)
				if !ok || g.Tok != token.VAR {
					continue
				}
				for _, spec := range g.Specs {
					vs := spec.(*ast.ValueSpec)
					if len(vs.Values) == 1 && allowed[callee(vs.Values[0])] {
						continue
					}
					t.Errorf("%s: package-level var %s: want a function, a switch or a constant", fs.Position(vs.Pos()), vs.Names[0].Name)
				}
			}
		}
	}
}

// callee names the package-qualified function an expression calls, "" if
// it is not such a call.
func callee(e ast.Expr) string {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return ""
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return ""
	}
	pkg, ok := sel.X.(*ast.Ident)
	if !ok {
		return ""
	}
	return pkg.Name + "." + sel.Sel.Name
}
