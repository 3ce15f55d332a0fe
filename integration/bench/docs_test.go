package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// withoutAssembled drops the line that carries the assembly date.
func withoutAssembled(page string) string {
	var keep []string
	for _, l := range strings.Split(page, "\n") {
		if !strings.HasPrefix(l, assembledPrefix) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// TestDocsBenchmarksUpToDate fails when docs/benchmarks.md is not what
// -docs writes from the results tables (a rerun whose tables were not
// assembled, or a hand edit of the page).
func TestDocsBenchmarksUpToDate(t *testing.T) {
	root := filepath.Join("..", "..")
	want, err := assembleDocs("results", filepath.Join(root, "docs"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(root, "docs", "benchmarks.md"))
	if err != nil {
		t.Fatal(err)
	}
	if withoutAssembled(string(got)) != withoutAssembled(want) {
		t.Fatalf("docs/benchmarks.md is out of date: run `%s` from the repository root", docsCommand)
	}
}

// TestAssembleDocs checks the page on a results directory of its own: each
// section under its title with its command, date, table and chart; links
// relative to the page.
func TestAssembleDocs(t *testing.T) {
	dir := t.TempDir()
	res := filepath.Join(dir, "integration", "bench", "results")
	if err := os.MkdirAll(res, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, s := range docSections {
		text := "### own heading\n\n2026-01-0" + string(rune('1'+i%9)) + " 10:00 UTC. About.\n\n| a |\n|---|\n| " + s.name + " |\n"
		if err := os.WriteFile(filepath.Join(res, s.name+".md"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(res, "memory.png"), []byte("png"), 0o644); err != nil {
		t.Fatal(err)
	}
	page, err := assembleDocs(res, filepath.Join(dir, "docs"), time.Date(2026, 2, 3, 0, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Assembled 2026-02-03 by `" + docsCommand + "`",
		"Measured 2026-01-01 to 2026-01-09",
		"## memory (in process): raw channel vs keyorder\n\nMeasured 2026-01-01 with:\n\n```sh\n" + docSections[0].command + "\n```",
		"| memory |",
		"![memory (in process): raw channel vs keyorder](../integration/bench/results/memory.png)",
		"- [PostgreSQL compaction](#postgresql-compaction)",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(page, "own heading") {
		t.Error("page keeps a results file's own heading")
	}
	if strings.Contains(page, "postgres.png") {
		t.Error("page links a chart that does not exist")
	}

	// A results file without a date is refused, naming the file.
	if err := os.WriteFile(filepath.Join(res, "sqs.md"), []byte("| a |\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := assembleDocs(res, filepath.Join(dir, "docs"), time.Now()); err == nil || !strings.Contains(err.Error(), "sqs.md names no date") {
		t.Fatalf("undated sqs.md: err = %v, want one naming it", err)
	}
}
