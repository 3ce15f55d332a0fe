// Command surface lists the exported names of every importable package of
// the workspace (all modules of go.work; internal packages, main packages
// and tests left out), one name a line, followed by the counts per package.
// It is how the public surface is measured before and after a change:
//
//	go run ./internal/apisurface/cmd/surface > surface.txt
//
// A line is "package kind name": kind is const, var, func or type for a
// package-level name, method for an exported method of an exported type
// (Type.Method) and field for an exported field of an exported struct type
// (Type.Field).
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

type pkg struct {
	ImportPath string
	Dir        string
	Name       string
	GoFiles    []string
}

type name struct{ kind, id string }

func main() {
	log.SetFlags(0)
	log.SetPrefix("surface: ")
	mods, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		log.Fatalf("go list -m: %v", err)
	}
	args := []string{"list", "-json=ImportPath,Dir,Name,GoFiles"}
	for _, dir := range strings.Fields(string(mods)) {
		args = append(args, dir+"/...")
	}
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		log.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			log.Fatal(err)
		}
		if p.Name == "main" || strings.Contains(p.ImportPath+"/", "/internal/") {
			continue
		}
		pkgs = append(pkgs, p)
	}
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].ImportPath < pkgs[j].ImportPath })
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	type count struct {
		path             string
		top, meth, field int
	}
	var counts []count
	for _, p := range pkgs {
		names := exported(p)
		c := count{path: p.ImportPath}
		for _, n := range names {
			fmt.Fprintf(w, "%s %s %s\n", p.ImportPath, n.kind, n.id)
			switch n.kind {
			case "method":
				c.meth++
			case "field":
				c.field++
			default:
				c.top++
			}
		}
		counts = append(counts, c)
	}
	fmt.Fprintln(w, "\n# package: package-level names / methods / fields")
	for _, c := range counts {
		fmt.Fprintf(w, "# %s: %d / %d / %d\n", c.path, c.top, c.meth, c.field)
	}
}

// exported returns the exported names of p, sorted by kind then name.
func exported(p pkg) []name {
	fset := token.NewFileSet()
	var names []name
	types := map[string]bool{}
	var files []*ast.File
	for _, f := range p.GoFiles {
		af, err := parser.ParseFile(fset, filepath.Join(p.Dir, f), nil, parser.SkipObjectResolution)
		if err != nil {
			log.Fatal(err)
		}
		files = append(files, af)
		for _, d := range af.Decls {
			if gd, ok := d.(*ast.GenDecl); ok && gd.Tok == token.TYPE {
				for _, s := range gd.Specs {
					if ts := s.(*ast.TypeSpec); ts.Name.IsExported() {
						types[ts.Name.Name] = true
					}
				}
			}
		}
	}
	for _, af := range files {
		for _, d := range af.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv == nil {
					names = append(names, name{"func", d.Name.Name})
					continue
				}
				if recv := recvType(d.Recv.List[0].Type); types[recv] {
					names = append(names, name{"method", recv + "." + d.Name.Name})
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if !s.Name.IsExported() {
							continue
						}
						names = append(names, name{"type", s.Name.Name})
						if st, ok := s.Type.(*ast.StructType); ok {
							for _, f := range st.Fields.List {
								for _, id := range f.Names {
									if id.IsExported() {
										names = append(names, name{"field", s.Name.Name + "." + id.Name})
									}
								}
								if len(f.Names) == 0 { // embedded
									if id := recvType(f.Type); ast.IsExported(id) {
										names = append(names, name{"field", s.Name.Name + "." + id})
									}
								}
							}
						}
					case *ast.ValueSpec:
						kind := "var"
						if d.Tok == token.CONST {
							kind = "const"
						}
						for _, id := range s.Names {
							if id.IsExported() {
								names = append(names, name{kind, id.Name})
							}
						}
					}
				}
			}
		}
	}
	order := map[string]int{"const": 0, "var": 1, "func": 2, "type": 3, "method": 4, "field": 5}
	sort.Slice(names, func(i, j int) bool {
		if order[names[i].kind] != order[names[j].kind] {
			return order[names[i].kind] < order[names[j].kind]
		}
		return names[i].id < names[j].id
	})
	return names
}

// recvType returns the name of the type expression e names (T, *T, T[P],
// pkg.T), or "".
func recvType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.SelectorExpr:
			return x.Sel.Name
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}
