package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// workspaceBrokers returns the scheme of every broker module the
// workspace holds (adapters/X in go.work with a Scheme constant; the
// Watermill mount has none), read from the sources beside this module.
func workspaceBrokers(t *testing.T) []string {
	t.Helper()
	root := filepath.Join("..", "..")
	work, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	schemeRE := regexp.MustCompile(`(?m)^\s*(?:const\s+)?Scheme\s*=\s*"([a-z0-9]+)"`)
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^\s*\./adapters/([a-z0-9]+)\s*$`).FindAllStringSubmatch(string(work), -1) {
		files, err := filepath.Glob(filepath.Join(root, "adapters", m[1], "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range schemeRE.FindAllStringSubmatch(string(src), -1) {
				out = append(out, s[1])
			}
		}
	}
	slices.Sort(out)
	if len(out) < 5 {
		t.Fatalf("found broker schemes %v in go.work's adapter modules: too few, the scan is broken", out)
	}
	return out
}

// TestHelpNamesEveryScheme: the binary registers every broker module of
// the workspace, and keyorder --help and the mem:// refusal name each of
// their schemes.
func TestHelpNamesEveryScheme(t *testing.T) {
	want := workspaceBrokers(t)
	got := brokerSchemes()
	if slices.ContainsFunc(want, func(s string) bool { return !slices.Contains(got, s) }) {
		t.Errorf("the binary registers %v; the workspace's broker modules are %v (a blank import missing in main.go?)", got, want)
	}
	_, help, _ := cmd(t, "", "--help")
	_, _, refusal := cmdAsShipped(t, "stats", "mem://t?subscription=s")
	for _, s := range want {
		if !strings.Contains(help, s+"://") {
			t.Errorf("keyorder --help does not name %s://:\n%s", s, help)
		}
		if !strings.Contains(refusal, s+"://") {
			t.Errorf("the mem:// refusal does not name %s://: %s", s, refusal)
		}
	}
}
