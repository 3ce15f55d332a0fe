package apisurface

import (
	"fmt"
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
// The longest matching prefix decides; "" is the root package. Every
// internal/ package is a helper below the portable API (layer 3): a helper
// that needs publish or subscribe is a test harness and lives in
// integration/ (the conformance suite, the crash-process harness), which
// sits above them.
var layers = map[string]int{
	"policy":             0, // enums only
	"internal/slab":      0,
	"internal/suggest":   0, // "did you mean": the URL errors and the command share it
	"":                   1, // the core types (Message, errors, keys)
	"driver":             2, // the contract a backend implements
	"internal/groupq":    2,
	"internal":           3, // helpers: message preparation, the memory broker's hooks, URL fuzzing, the house's own tests
	"lanes":              3,
	"publish":            4,
	"subscribe":          4,
	"adapters":           5, // backends: the contract below, publish/subscribe for their Open helpers
	"keyordertest":       6,
	"otelkeyorder":       6,
	"adapters/watermill": 6, // mounts the portable packages on Watermill
	"integration":        6, // drivertest (the conformance suite) and proctest, importable by adapter modules
	"integration/cmd":    8,
	"integration/bench":  8,
	"integration/smoke":  8,
	"cmd":                8,
	"examples":           8,
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

// upward returns, for the output of `go list -f '{{.ImportPath}} {{join
// .Deps " "}}'`, every dependency of a package of this repository on one of
// a higher layer ("pkg (layer n) depends on dep (layer m)"), the packages
// no rule places, and the number of dependencies checked.
func upward(list string) (back, unplaced []string, checked int) {
	for line := range strings.SplitSeq(strings.TrimSpace(list), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		pkg := f[0]
		lp, ok := layerOf(pkg)
		if !ok {
			unplaced = append(unplaced, pkg)
			continue
		}
		for _, dep := range f[1:] {
			if dep != module && !strings.HasPrefix(dep, module+"/") {
				continue
			}
			checked++
			if ld, ok := layerOf(dep); ok && ld > lp {
				back = append(back, fmt.Sprintf("%s (layer %d) depends on %s (layer %d)", pkg, lp, dep, ld))
			}
		}
	}
	return back, unplaced, checked
}

// TestLayering fails when a package depends on a package of a higher layer,
// checked over `go list -deps` of every module in the workspace, so that an
// import running back up the house (a driver importing subscribe, the
// contract importing a backend, an internal helper importing publish) is
// caught when it is written. It says how many dependencies it checked and
// that none runs back up.
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
	back, unplaced, checked := upward(out)
	for _, p := range unplaced {
		t.Errorf("package %s has no layer: add it to layers", p)
	}
	for _, b := range back {
		t.Error(b)
	}
	packages := strings.Count(strings.TrimSpace(out), "\n") + 1
	if packages < 20 {
		t.Fatalf("listed %d packages; want every package of every module", packages)
	}
	t.Logf("%d packages, %d dependencies on the repository's own packages; %d run back up", packages, checked, len(back))
}

// TestLayeringCatchesAnImportBackUp runs the check on listings with one
// dependency running back up each (as internal/opentest's imports of
// publish and subscribe did), so a check that finds nothing cannot pass
// unnoticed.
func TestLayeringCatchesAnImportBackUp(t *testing.T) {
	for _, tc := range []struct{ pkg, dep string }{
		{"internal/opentest", "publish"},
		{"internal/proctest", "subscribe"},
		{"driver", "subscribe"},
		{"publish", "adapters/postgres"},
		{"adapters/kafka", "integration/drivertest"},
		{"", "policy/x"}, // a new package under a placed prefix
	} {
		pkg := strings.TrimSuffix(module+"/"+tc.pkg, "/")
		list := pkg + " " + module + "/policy " + module + "/" + tc.dep + " golang.org/x/time/rate\n" +
			module + "/policy\n"
		back, unplaced, checked := upward(list)
		if tc.dep == "policy/x" {
			if len(back) != 0 {
				t.Errorf("%s -> %s: %v, want nothing (policy/x is layer 0)", tc.pkg, tc.dep, back)
			}
			continue
		}
		if len(back) != 1 || !strings.Contains(back[0], module+"/"+tc.dep) || len(unplaced) != 0 || checked != 2 {
			t.Errorf("%s -> %s: back %q, unplaced %q, checked %d; want the one import back up of 2 checked", tc.pkg, tc.dep, back, unplaced, checked)
		}
	}
	if _, unplaced, _ := upward(module + "/nowhere " + module); len(unplaced) != 1 {
		t.Errorf("unplaced = %q, want the one package no rule places", unplaced)
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
		module + "/internal/urlfuzz":        3,
		module + "/integration/proctest":    6,
		module + "/integration/drivertest":  6,
	} {
		if got, ok := layerOf(p); !ok || got != want {
			t.Errorf("layerOf(%s) = %d, %v; want %d", p, got, ok, want)
		}
	}
	if _, ok := layerOf(module + "/nowhere"); ok {
		t.Error("an unlisted package got a layer")
	}
}
