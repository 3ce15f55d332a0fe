package doclinks

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// A backend list is a run of backend names in prose, close together and
// within one sentence ("PostgreSQL, Pub/Sub, SQS, Pulsar and Kafka"; a
// table header "| memory | postgres | pubsub |"). A run that names at least
// three backends is taken for a list of them all: if it names the in-memory
// backend it must name every registered scheme, otherwise every broker
// (every scheme but mem). A deliberate subset ("Pub/Sub and Pulsar hold in
// process, SQS ...") goes on notLists with the reason.

// backendNames maps a scheme to the pattern of the names prose gives its
// backend. A scheme missing here (a new backend) is named by its scheme,
// case-insensitively.
var backendNames = map[string]string{
	"mem":      `(?i)\bin-memory\b|\bmemory\b|\bmem\b`,
	"postgres": `(?i)\bpostgres(?:ql)?\b`,
	"pubsub":   `(?i)(?:\b|_)pub/?sub\b`,
	"sqs":      `(?i)(?:\b|_)sqs\b|\bElasticMQ\b`,
	"pulsar":   `(?i)\bpulsar\b`,
	"kafka":    `(?i)\bkafka\b`,
	"nats":     `(?i)\bnats\b`,
}

// memScheme is the in-memory backend's scheme: it lives in the root module
// and is not a broker.
const memScheme = "mem"

// maxGap is the most text between two names of one list.
const maxGap = 40

// gapBreak ends a list: a sentence, a clause after a colon or semicolon,
// a line break inside a Go comment's code.
var gapBreak = regexp.MustCompile(`[.;:!?]\s|[.;:!?]$|\n`)

// notList is a run of backend names that names some of them on purpose.
type notList struct {
	file   string // relative to root, slash-separated
	text   string // a substring of the run's paragraph, whitespace collapsed
	reason string
}

// notLists are the deliberate subsets. TestNotListsStillApply keeps each
// one needed: an entry whose paragraph no longer fails the check must go.
var notLists = []notList{
	{"README.md", "creates its subscription on `mem://`, Pub/Sub and Pulsar", "the backends that create a subscription on open; the sentence goes on with PostgreSQL and SQS"},
	{"README.md", "-backend pulsar -rpcs", "benchmark rows name the backends they measured"},
	{"cmd/keyorder/held.go", "Pub/Sub, Pulsar, Kafka and NATS hold keys", "the backends that hold keys in process"},
	{"cmd/keyorder/stats.go", "What each backend reports today: PostgreSQL every field.", "per-backend detail: PostgreSQL first, then the rest"},
	{"docs/benchmarks.md", "SQS consume, Pub/Sub and Pulsar publish and Kafka", "the rows measured before the tables were rerun"},
	{"docs/operations.md", "Where the process holds keys (Pub/Sub, Pulsar, Kafka, and", "the backends that hold keys in process"},
	{"docs/operations.md", "What the held gauges measure", "the backends that hold keys in process"},
	{"docs/testing.md", "`./integration/test.sh` starts every server the tests need", "PostgreSQL is named first, with its packaging"},
	{"docs/watermill.md", "takes a topic URL template:", "three example templates"},
	{"docs/observability.md", "That is exact where the consuming process holds keys", "the backends that hold keys in process"},
	{"otelkeyorder/otelkeyorder.go", "That is exact where retries run in process", "the backends that hold keys in process"},
	{"subscribe/doc.go", "Where the process holds groups", "the backends that hold keys in process"},
	{"subscribe/doc.go", "Where the broker holds groups natively", "the backends that hold keys on the broker"},
	{"subscribe/doc.go", "backends that create the subscription on open", "the backends that create a subscription on open"},
}

// schemeRE matches an adapter's scheme constant.
var schemeRE = regexp.MustCompile(`(?m)^\s*(?:const\s+)?Scheme\s*=\s*"([a-z0-9+.-]+)"`)

// registeredSchemes returns the schemes the adapters under root/adapters
// register, by the Scheme constant every adapter declares, with the
// adapter's directory.
func registeredSchemes(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "adapters", "*", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range schemeRE.FindAllStringSubmatch(string(raw), -1) {
			out[m[1]] = filepath.Base(filepath.Dir(f))
		}
	}
	return out
}

// moduleDirs returns the adapter modules go.work uses (adapters/X).
func moduleDirs(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^\s*\./adapters/([a-z0-9]+)\s*$`).FindAllStringSubmatch(string(raw), -1) {
		out = append(out, m[1])
	}
	return out
}

// mention is one backend name in a paragraph.
type mention struct {
	scheme     string
	start, end int
}

// listFinding is a list that leaves backends out.
type listFinding struct {
	file, para string
	run        string // the list itself
	line       int
	named      []string
	missing    []string
}

func (f listFinding) String() string {
	return fmt.Sprintf("%s:%d: a list of backends names %s but not %s: %q",
		f.file, f.line, strings.Join(f.named, ", "), strings.Join(f.missing, ", "), clip(f.run))
}

func clip(s string) string {
	if len(s) > 160 {
		return s[:160] + "…"
	}
	return s
}

// paragraph is text between blank lines, its lines joined by spaces (by
// newlines for Go code kept as code), with the number of its first line.
type paragraph struct {
	text string
	line int
}

// paragraphs splits text at blank lines.
func paragraphs(text string) []paragraph {
	var out []paragraph
	var cur []string
	first := 0
	flush := func() {
		if len(cur) > 0 {
			out = append(out, paragraph{strings.Join(cur, " "), first})
		}
		cur = nil
	}
	for i, l := range strings.Split(text, "\n") {
		t := strings.TrimSpace(l)
		if t == "" {
			flush()
			continue
		}
		if len(cur) == 0 {
			first = i + 1
		}
		cur = append(cur, t)
	}
	flush()
	return out
}

// findLists returns the lists in the paragraphs of file that leave out one
// of want (all schemes) or, for a list without mem, one of the brokers.
func findLists(file string, paras []paragraph, want []string, names map[string]*regexp.Regexp) []listFinding {
	var out []listFinding
	for _, p := range paras {
		var ms []mention
		for s, re := range names {
			for _, loc := range re.FindAllStringIndex(p.text, -1) {
				ms = append(ms, mention{s, loc[0], loc[1]})
			}
		}
		sort.Slice(ms, func(i, j int) bool { return ms[i].start < ms[j].start })
		for i := 0; i < len(ms); {
			j := i + 1
			for j < len(ms) {
				gap := p.text[ms[j-1].end:ms[j].start]
				if ms[j].start < ms[j-1].end || len(gap) > maxGap || gapBreak.MatchString(gap) {
					break
				}
				j++
			}
			named := map[string]bool{}
			for _, m := range ms[i:j] {
				named[m.scheme] = true
			}
			run := p.text[ms[i].start:ms[j-1].end]
			i = j
			if len(named) < 3 {
				continue
			}
			var missing []string
			for _, s := range want {
				if !named[s] && (s != memScheme || named[memScheme]) {
					missing = append(missing, s)
				}
			}
			if len(missing) == 0 {
				continue
			}
			var ns []string
			for s := range named {
				ns = append(ns, s)
			}
			sort.Strings(ns)
			out = append(out, listFinding{file: file, para: p.text, run: run, line: p.line, named: ns, missing: missing})
		}
	}
	return out
}

// packageDoc returns a Go file's package comment, its // stripped, with the
// line it starts on.
func packageDoc(src string) (string, int) {
	lines := strings.Split(src, "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, "package ") {
			continue
		}
		j := i
		for j > 0 && strings.HasPrefix(lines[j-1], "//") {
			j--
		}
		var b strings.Builder
		for _, c := range lines[j:i] {
			c = strings.TrimPrefix(strings.TrimPrefix(c, "//"), " ")
			if strings.HasPrefix(c, "go:") || strings.HasPrefix(c, "+build") {
				c = ""
			}
			b.WriteString(c + "\n")
		}
		return b.String(), j + 1
	}
	return "", 0
}

// listSources returns, per file relative to root, its paragraphs to check:
// README.md, CONTRIBUTING.md, docs/*.md, every package comment of the
// workspace, and the command's help (its Go files whole).
func listSources(t *testing.T) map[string][]paragraph {
	t.Helper()
	out := map[string][]paragraph{}
	read := func(rel string) string {
		raw, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		return string(raw)
	}
	md := []string{"README.md", "CONTRIBUTING.md"}
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	for _, d := range docs {
		md = append(md, filepath.ToSlash(must(filepath.Rel(root, d))))
	}
	for _, f := range md {
		out[f] = paragraphs(read(f))
	}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := filepath.ToSlash(must(filepath.Rel(root, path)))
		if d.IsDir() {
			if n := d.Name(); rel != "." && (strings.HasPrefix(n, ".") || n == "testdata" || n == "results") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		src := read(rel)
		if strings.HasPrefix(rel, "cmd/keyorder/") {
			// The help is in string literals, the package doc in comments:
			// the whole file, comment markers dropped.
			lines := strings.Split(src, "\n")
			for i, l := range lines {
				lines[i] = strings.TrimPrefix(strings.TrimSpace(l), "//")
			}
			out[rel] = paragraphs(strings.Join(lines, "\n"))
			return nil
		}
		if doc, line := packageDoc(src); doc != "" {
			ps := paragraphs(doc)
			for i := range ps {
				ps[i].line += line - 1
			}
			out[rel] = ps
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func compileNames(schemes []string) map[string]*regexp.Regexp {
	out := map[string]*regexp.Regexp{}
	for _, s := range schemes {
		p, ok := backendNames[s]
		if !ok {
			p = `(?i)\b` + regexp.QuoteMeta(s) + `\b`
		}
		out[s] = regexp.MustCompile(p)
	}
	return out
}

// collapse folds runs of whitespace into one space.
func collapse(s string) string { return strings.Join(strings.Fields(s), " ") }

// exempt reports the notLists entry that covers f, if any.
func exempt(f listFinding) (int, bool) {
	for i, n := range notLists {
		if n.file == f.file && strings.Contains(collapse(f.para), collapse(n.text)) {
			return i, true
		}
	}
	return 0, false
}

func schemeList(t *testing.T) []string {
	t.Helper()
	reg := registeredSchemes(t)
	var schemes []string
	for s := range reg {
		schemes = append(schemes, s)
	}
	sort.Strings(schemes)
	return schemes
}

// TestBackendListsComplete checks every list of backends in the README,
// CONTRIBUTING, docs/, package comments and the command's help against the
// registered schemes, and the schemes against the module list.
func TestBackendListsComplete(t *testing.T) {
	reg := registeredSchemes(t)
	schemes := schemeList(t)
	if !slices.Contains(schemes, memScheme) || len(schemes) < 6 {
		t.Fatalf("registered schemes %v: the scan of adapters/*/ found too few", schemes)
	}
	// Every broker is a module of its own, and every adapter module but the
	// Watermill mount registers a scheme.
	mods := moduleDirs(t)
	for s, dir := range reg {
		if s != memScheme && !slices.Contains(mods, dir) {
			t.Errorf("scheme %s (adapters/%s) is not a module in go.work", s, dir)
		}
	}
	for _, m := range mods {
		if m == "watermill" {
			continue
		}
		found := false
		for _, dir := range reg {
			found = found || dir == m
		}
		if !found {
			t.Errorf("module adapters/%s registers no scheme (no Scheme constant)", m)
		}
	}
	names := compileNames(schemes)
	srcs := listSources(t)
	files := make([]string, 0, len(srcs))
	for f := range srcs {
		files = append(files, f)
	}
	sort.Strings(files)
	found := false
	for _, f := range files {
		for _, l := range findLists(f, srcs[f], schemes, names) {
			if _, ok := exempt(l); !ok {
				t.Error(l)
				found = true
			}
		}
	}
	if found {
		t.Log("A new backend: name it in each list above where it belongs (and make true what the list says of it). " +
			"A list that is about some backends on purpose: add it to notLists in internal/doclinks/lists_test.go with the reason.")
	}
}

// TestNotListsStillApply fails on a notLists entry that no longer covers a
// list leaving a backend out: it is stale and must go.
func TestNotListsStillApply(t *testing.T) {
	schemes := schemeList(t)
	names := compileNames(schemes)
	srcs := listSources(t)
	used := make([]bool, len(notLists))
	for f, ps := range srcs {
		for _, l := range findLists(f, ps, schemes, names) {
			if i, ok := exempt(l); ok {
				used[i] = true
			}
		}
	}
	for i, u := range used {
		if !u {
			t.Errorf("notLists entry %q in %s covers no partial list any more: remove it", notLists[i].text, notLists[i].file)
		}
	}
}

// TestListCheckerNamesWhatIsMissing runs the checker on text of its own,
// so that a checker that finds nothing cannot pass unnoticed.
func TestListCheckerNamesWhatIsMissing(t *testing.T) {
	schemes := []string{"kafka", "mem", "postgres", "pubsub", "pulsar", "sqs"}
	names := compileNames(schemes)
	text := strings.Join([]string{
		"Over the in-memory broker, PostgreSQL, Google Cloud Pub/Sub, Amazon SQS FIFO, Apache Pulsar and Apache Kafka.",
		"",
		"It runs on PostgreSQL, Pub/Sub, SQS or Pulsar.",
		"",
		"| | memory | postgres | pubsub | sqs | pulsar |",
		"",
		"Pub/Sub and Pulsar hold in process. SQS holds natively.",
		"",
		"PostgreSQL holds natively; Pub/Sub, Pulsar and SQS do not: they hold in process.",
		"",
		"the PostgreSQL, Pub/Sub, SQS, Pulsar and Kafka schemes",
	}, "\n")
	got := findLists("x.md", paragraphs(text), schemes, names)
	var lines []string
	for _, f := range got {
		lines = append(lines, fmt.Sprintf("%d: %s missing %s", f.line, strings.Join(f.named, ","), strings.Join(f.missing, ",")))
	}
	want := []string{
		"3: postgres,pubsub,pulsar,sqs missing kafka",
		"5: mem,postgres,pubsub,pulsar,sqs missing kafka",
		"9: pubsub,pulsar,sqs missing kafka,postgres",
	}
	if !slices.Equal(lines, want) {
		t.Errorf("findings:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	// A new scheme with no names of its own is found by its scheme.
	withNATS := append(slices.Clone(schemes), "nats")
	got = findLists("x.md", paragraphs("PostgreSQL, Pub/Sub, SQS, Pulsar and Kafka."), withNATS, compileNames(withNATS))
	if len(got) != 1 || !slices.Equal(got[0].missing, []string{"nats"}) {
		t.Errorf("with a nats scheme: %v, want one list missing nats", got)
	}
}
