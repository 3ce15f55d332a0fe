package doclinks

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestRootRequiresNamed: README.md says what the root module requires, in
// its Install section and in the modules table; both name every direct
// requirement of go.mod (the README once said "only google/uuid" when
// golang.org/x/time was required too).
func TestRootRequiresNamed(t *testing.T) {
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	reqs := directRequires(string(mod))
	if len(reqs) == 0 {
		t.Fatal("no requirement found in go.mod: the parsing is broken")
	}
	raw, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	install := section(readme, "## Install")
	var row string
	for _, l := range strings.Split(readme, "\n") {
		if strings.HasPrefix(l, "| `github.com/keyorder/keyorder` |") {
			row = l
		}
	}
	if install == "" || row == "" {
		t.Fatalf("README.md: Install section found %v, root module row found %v", install != "", row != "")
	}
	for _, r := range reqs {
		if !strings.Contains(install, r) {
			t.Errorf("README.md's Install section does not name %s, which the root module requires", r)
		}
		if !strings.Contains(row, r) {
			t.Errorf("README.md's modules table does not name %s in the root module's row", r)
		}
	}
}

// directRequires returns the module paths go.mod requires directly.
func directRequires(mod string) []string {
	var out []string
	in := false
	lineRE := regexp.MustCompile(`^\s*(?:require\s+)?([^\s()]+)\s+v\S+\s*(//.*)?$`)
	for _, l := range strings.Split(mod, "\n") {
		t := strings.TrimSpace(l)
		switch {
		case t == "require (":
			in = true
			continue
		case in && t == ")":
			in = false
			continue
		case !in && !strings.HasPrefix(t, "require "):
			continue
		}
		m := lineRE.FindStringSubmatch(l)
		if m == nil || strings.Contains(m[2], "indirect") {
			continue
		}
		out = append(out, m[1])
	}
	return out
}

// section returns a Markdown section from its heading to the next heading
// of the same level.
func section(text, heading string) string {
	i := strings.Index(text, "\n"+heading+"\n")
	if i < 0 {
		return ""
	}
	rest := text[i+1+len(heading):]
	if j := strings.Index(rest, "\n## "); j >= 0 {
		rest = rest[:j]
	}
	return rest
}
