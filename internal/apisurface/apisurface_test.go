package apisurface

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// driverTypes returns the exported type names package driver declares
// (aliases included), parsed from its source.
func driverTypes(t *testing.T, dir string) map[string]bool {
	t.Helper()
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]bool{}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, s := range gd.Specs {
				if ts := s.(*ast.TypeSpec); ts.Name.IsExported() {
					types[ts.Name.Name] = true
				}
			}
		}
	}
	if len(types) == 0 {
		t.Fatalf("no exported types found in %s", dir)
	}
	return types
}

var (
	qualified = regexp.MustCompile(`\bdriver\.([A-Z]\w*)`)
	// allowed are the lines that may name a driver type: the
	// constructors over a driver.
	allowed = regexp.MustCompile(`^func New\(drv driver\.\w+, `)
)

// TestPortableSurface fails when `go doc -all` of publish or subscribe
// names a type of package driver anywhere but in New: in a signature, a
// field, or the documentation.
func TestPortableSurface(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not found")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	types := driverTypes(t, filepath.Join(root, "driver"))
	for _, pkg := range []string{"./publish", "./subscribe"} {
		cmd := exec.Command(goBin, "doc", "-all", pkg)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go doc -all %s: %v\n%s", pkg, err, out)
		}
		news := 0
		for i, line := range strings.Split(string(out), "\n") {
			if allowed.MatchString(line) {
				news++
				continue
			}
			for _, m := range qualified.FindAllStringSubmatch(line, -1) {
				if types[m[1]] {
					t.Errorf("go doc %s, line %d names driver.%s (only New may): %s", pkg, i+1, m[1], strings.TrimSpace(line))
				}
			}
		}
		if news != 1 {
			t.Errorf("go doc %s: %d New(drv driver.…) constructors, want 1 (did the output format change?)", pkg, news)
		}
	}
}
