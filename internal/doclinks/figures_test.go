package doclinks

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// A benchmark figure quoted in prose is a number with a unit a measurement
// gives: a ratio (1.55×, 7.08x), a rate in thousands (43.2k) or a share
// (68 %), or a range of them (0.17–0.25×). Every one in README.md,
// docs/*.md (docs/benchmarks.md is assembled from the results, so it is
// skipped) and CHANGELOG.md's Unreleased section must appear in a results
// file, integration/bench/results/*.md, with the same value at the
// precision the prose gives: 43.2k matches 43,214 msgs/s, 7.1× matches
// 7.08×. A number of that shape that is not a measurement (a tenant's 100×
// share, a 2× backoff) goes on notFigures with the reason.

// figureRE matches a figure or a range of them with its unit.
var figureRE = regexp.MustCompile(`(\d[\d,]*(?:\.\d+)?)(?:\s*(?:–|-|to)\s*(\d[\d,]*(?:\.\d+)?))?\s?(×|(?:\.\d+)?x\b|k\b|%)`)

// resultRE matches a number, or a run of them ("85 / 82 / 68 %", "−11 to
// −17 %"), with the unit that ends it in a results file; a bare number is
// a count (msgs/s, ms, ...).
var resultRE = regexp.MustCompile(`(\d[\d,]*(?:\.\d+)?(?:\s*(?:/|–|to)\s*[−-]?\d[\d,]*(?:\.\d+)?)*)\s?(×|x\b|k\b|M\b|%)?`)

// numberRE matches one number of such a run.
var numberRE = regexp.MustCompile(`\d[\d,]*(?:\.\d+)?`)

// notFigure is a number of a figure's shape that no benchmark measured.
type notFigure struct {
	file   string // relative to root, slash-separated
	figure string // as the prose writes it
	reason string
}

// notFigures are the numbers of a figure's shape that are not measured
// figures. TestFiguresMeasured fails on an entry that no longer occurs.
var notFigures = []notFigure{
	{"docs/observability.md", "20 %", "the retry policy's jitter and an alert's threshold"},
	{"CHANGELOG.md", "20 %", "an alert's threshold (the observability kit)"},
	{"CHANGELOG.md", "78–97k", "the runs of the change (load average 8–10); results/postgres.md keeps the later rerun"},
}

// results holds the values of the results files by unit: "x" ratios, "%"
// shares, "n" plain numbers (thousands written as 43.2k or 43,214 both).
type results map[string][]float64

func loadResults(t *testing.T, dir string) map[string]results {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no results files in %s", dir)
	}
	out := map[string]results{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		r := results{}
		r.add(string(raw))
		out[filepath.Base(f)] = r
	}
	return out
}

// pageResults are the results files a backend's page may quote, beyond
// the file of its own name and other.md (runs that compare several
// backends or options): a figure on docs/postgres.md must come from a
// PostgreSQL run, so a figure that drifts to a value some other
// backend's run happens to hold is still found. Pages of no backend
// (README, CHANGELOG, the guide, the coming-from pages) may quote any.
var pageResults = map[string][]string{
	"docs/postgres.md": {"pgtx.md", "pgbatch.md", "pgcompact.md", "fairness-postgres.md"},
}

// sourcesOf returns the results a page's figures are checked against.
func sourcesOf(page string, all map[string]results) results {
	base := strings.TrimSuffix(strings.TrimPrefix(page, "docs/"), ".md")
	if _, ok := all[base+".md"]; !strings.HasPrefix(page, "docs/") || !ok {
		merged := results{}
		for _, r := range all {
			for k, v := range r {
				merged[k] = append(merged[k], v...)
			}
		}
		return merged
	}
	merged := results{}
	for _, name := range append([]string{base + ".md", "other.md"}, pageResults[page]...) {
		for k, v := range all[name] {
			merged[k] = append(merged[k], v...)
		}
	}
	return merged
}

func (r results) add(text string) {
	for _, m := range resultRE.FindAllStringSubmatch(text, -1) {
		for _, n := range numberRE.FindAllString(m[1], -1) {
			r.addOne(n, m[2])
		}
	}
}

func (r results) addOne(n, unit string) {
	{
		v, err := strconv.ParseFloat(strings.ReplaceAll(n, ",", ""), 64)
		if err != nil {
			return
		}
		switch unit {
		case "×", "x":
			r["x"] = append(r["x"], v)
		case "%":
			r["%"] = append(r["%"], v)
		case "k":
			r["n"] = append(r["n"], v*1000)
		case "M":
			r["n"] = append(r["n"], v*1e6)
		default:
			r["n"] = append(r["n"], v)
		}
	}
}

// decimals returns the number of digits after the point in s.
func decimals(s string) int {
	if i := strings.IndexByte(s, '.'); i >= 0 {
		return len(s) - i - 1
	}
	return 0
}

// has reports whether a results value of unit rounds to the prose figure
// s (a number as written, in thousands for "k").
func (r results) has(unit, s string) bool {
	v, err := strconv.ParseFloat(strings.ReplaceAll(s, ",", ""), 64)
	if err != nil {
		return false
	}
	d := decimals(s)
	scale := 1.0
	key := unit
	switch unit {
	case "k":
		scale, key = 1000, "n"
	case "×", "x":
		key = "x"
	}
	p := math.Pow(10, float64(d))
	for _, got := range r[key] {
		if math.Abs(math.Round(got/scale*p)-math.Round(v*p)) < 0.5 {
			return true
		}
	}
	return false
}

// figureFinding is a figure no results file has.
type figureFinding struct {
	file, figure string
	line         int
}

func (f figureFinding) String() string {
	return fmt.Sprintf("%s:%d: %s appears in no results file (integration/bench/results/*.md)", f.file, f.line, f.figure)
}

// unreleased returns the Unreleased section of a changelog, the rest blank
// (line numbers kept).
func unreleased(text string) string {
	lines := strings.Split(text, "\n")
	in := false
	for i, l := range lines {
		if strings.HasPrefix(l, "## ") {
			in = strings.Contains(l, "Unreleased")
		}
		if !in {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

// findFigures returns the figures of a page's prose that r does not have.
func findFigures(file, text string, r results) []figureFinding {
	var out []figureFinding
	for i, l := range prose(text) {
		for _, m := range figureRE.FindAllStringSubmatch(l, -1) {
			unit := m[3]
			if strings.HasSuffix(unit, "x") {
				unit = "x"
			}
			// A bare "x" only after a decimal (1.5x); "100x" is a share.
			if unit == "x" && !strings.Contains(m[0], ".") {
				continue
			}
			ok := r.has(unit, m[1]) && (m[2] == "" || r.has(unit, m[2]))
			if !ok {
				out = append(out, figureFinding{file, strings.TrimSpace(m[0]), i + 1})
			}
		}
	}
	return out
}

// figurePages returns the pages to check with their text.
func figurePages(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	read := func(rel string) string {
		raw, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		return string(raw)
	}
	out["README.md"] = read("README.md")
	out["CHANGELOG.md"] = unreleased(read("CHANGELOG.md"))
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	for _, d := range docs {
		rel := filepath.ToSlash(must(filepath.Rel(root, d)))
		if rel == "docs/benchmarks.md" {
			continue
		}
		out[rel] = read(rel)
	}
	return out
}

func TestFiguresMeasured(t *testing.T) {
	all := loadResults(t, filepath.Join(root, "integration", "bench", "results"))
	pages := figurePages(t)
	names := make([]string, 0, len(pages))
	for p := range pages {
		names = append(names, p)
	}
	sort.Strings(names)
	used := make([]bool, len(notFigures))
	for _, p := range names {
	next:
		for _, f := range findFigures(p, pages[p], sourcesOf(p, all)) {
			for i, n := range notFigures {
				if n.file == f.file && n.figure == f.figure {
					used[i] = true
					continue next
				}
			}
			t.Error(f)
		}
	}
	for i, u := range used {
		if !u {
			t.Errorf("notFigures entry %q in %s no longer occurs unmeasured: remove it", notFigures[i].figure, notFigures[i].file)
		}
	}
}

// TestFigureCheckerFindsDrift runs the checker on a page and results of its
// own: a figure that drifted from its results is found, one that rounds to
// a result is not.
func TestFigureCheckerFindsDrift(t *testing.T) {
	r := results{}
	r.add("| 64 | keyorder | 43,214 | **7.08×** | 68 % | 0.17× | 0.25× | 603k | 1.5x | 85 / 82 % | −11 to −17 % |")
	page := strings.Join([]string{
		"Shared reaches 43.2k msgs/s (68 %), 7.1× the raw consumer, 0.17–0.25× on Kafka, 603k, 1.5x.",
		"ByKey reaches 29k msgs/s (45 %), 7.3× the raw consumer, 0.12–0.25×, 1.6x.",
		"`99k in code` and a 100x tenant, 85 to 82 %, 11 to 17 %.",
		"```",
		"12.5× in a fence",
		"```",
	}, "\n")
	var got []string
	for _, f := range findFigures("p.md", page, r) {
		got = append(got, fmt.Sprintf("%d %s", f.line, f.figure))
	}
	want := []string{"2 29k", "2 45 %", "2 7.3×", "2 0.12–0.25×", "2 1.6x"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("findings %q, want %q", got, want)
	}
}

// TestBackendPageQuotesItsOwnRuns: a backend's page is checked against its
// own results (and other.md), so a figure that only another backend's run
// holds is found there, while README may quote any run.
func TestBackendPageQuotesItsOwnRuns(t *testing.T) {
	all := map[string]results{"kafka.md": {}, "memory.md": {}, "other.md": {}}
	all["kafka.md"].add("| 0.17× | 0.18× |")
	all["memory.md"].add("| 0.12× |")
	page := "keyorder consumes at 0.12–0.18× the raw client."
	if got := findFigures("docs/kafka.md", page, sourcesOf("docs/kafka.md", all)); len(got) != 1 || got[0].figure != "0.12–0.18×" {
		t.Errorf("docs/kafka.md findings %v, want the memory-only 0.12–0.18×", got)
	}
	if got := findFigures("README.md", page, sourcesOf("README.md", all)); len(got) != 0 {
		t.Errorf("README.md findings %v, want none", got)
	}
}
