package apisurface

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/keyorder/keyorder"

// layers puts every package of the repository (all modules of go.work) on a
// layer. A package may depend, directly or not, only on packages of its own
// layer or a lower one. A package no rule names fails the test: a new
// package must be given its place.
//
// The longest matching prefix decides; "" is the root package.
var layers = map[string]int{
	"policy":              0, // enums only
	"internal/slab":       0,
	"internal/suggest":    0, // "did you mean": the URL errors and the command share it
	"":                    1, // the core types (Message, errors, keys)
	"driver":              2, // the contract a backend implements
	"internal/groupq":     2,
	"internal/driverkit":  3, // message preparation shared by publish and built-in drivers
	"internal/memhook":    3, // the memory broker's drivers and fault hooks, for tests
	"lanes":               3,
	"publish":             4,
	"subscribe":           4,
	"adapters":            5, // backends: the contract below, publish/subscribe for their Open helpers
	"keyordertest":        6,
	"otelkeyorder":        6,
	"adapters/watermill":  6, // mounts the portable packages on Watermill
	"integration":         6, // the conformance suite, importable by adapter modules
	"internal/opentest":   6,
	"internal/proctest":   6, // crash tests' consumer processes, for adapter modules' tests
	"internal/urlfuzz":    6,
	"internal/apisurface": 7,
	"internal/doclinks":   7, // a test of the Markdown links; imports nothing of ours
	"integration/testenv": 7, // the servers' launcher: imports nothing of ours
	"integration/cmd":     8,
	"integration/bench":   8,
	"integration/smoke":   8,
	"cmd":                 8,
	"examples":            8,
}

// layerOf returns the layer of import path p of this repository.
func layerOf(p string) (int, bool) {
	rel := strings.TrimPrefix(strings.TrimPrefix(p, module), "/")
	for rel != "" {
		if l, ok := layers[rel]; ok {
			return l, true
		}
		i := strings.LastIndex(rel, "/")
		if i < 0 {
			break
		}
		rel = rel[:i]
	}
	if l, ok := layers[rel]; ok && rel == "" && p == module {
		return l, true
	}
	return 0, false
}

// TestLayering fails when a package depends on a package of a higher layer,
// checked over `go list -deps` of every module in the workspace, so that an
// import running back up the house (a driver importing subscribe, the
// contract importing a backend) is caught when it is written.
func TestLayering(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("go command not found")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		cmd := exec.Command(goBin, args...)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go %s: %v", strings.Join(args, " "), err)
		}
		return string(out)
	}
	var patterns []string
	for _, dir := range strings.Fields(run("list", "-m", "-f", "{{.Dir}}")) {
		patterns = append(patterns, dir+"/...")
	}
	out := run(append([]string{"list", "-f", "{{.ImportPath}} {{join .Deps \" \"}}"}, patterns...)...)
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		pkg := f[0]
		lp, ok := layerOf(pkg)
		if !ok {
			t.Errorf("package %s has no layer: add it to layers", pkg)
			continue
		}
		checked++
		for _, dep := range f[1:] {
			if dep != module && !strings.HasPrefix(dep, module+"/") {
				continue
			}
			if ld, ok := layerOf(dep); ok && ld > lp {
				t.Errorf("%s (layer %d) depends on %s (layer %d)", pkg, lp, dep, ld)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked %d packages; want every package of every module", checked)
	}
}

// TestLayerOf guards the prefix rule itself.
func TestLayerOf(t *testing.T) {
	for p, want := range map[string]int{
		module:                              1,
		module + "/driver":                  2,
		module + "/adapters/postgres":       5,
		module + "/adapters/watermill":      6,
		module + "/adapters/watermill/x":    6,
		module + "/integration/cmd/testenv": 8,
		module + "/internal/driverkit":      3,
	} {
		if got, ok := layerOf(p); !ok || got != want {
			t.Errorf("layerOf(%s) = %d, %v; want %d", p, got, ok, want)
		}
	}
	if _, ok := layerOf(module + "/internal/nowhere"); ok {
		t.Error("an unlisted internal package got a layer")
	}
}
