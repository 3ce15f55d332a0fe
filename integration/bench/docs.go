package main

// -docs FILE: assemble docs/benchmarks.md from the tables the runs wrote to
// the results directory. It runs no benchmark: a page of figures written by
// hand drifts from the runs (one benchmark ends up with several counts), so
// the page is only ever the concatenation of what was measured, each table
// under the command that produced it and the date it was measured.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// docSection is one results file on the benchmarks page.
type docSection struct {
	// name is the results file without ".md" (and its chart's, with ".png").
	name  string
	title string
	// command reproduces the table (from the repository root).
	command string
	// perRow marks a file whose rows carry their own commands and dates.
	perRow bool
}

// docSections lists the page's sections in order.
var docSections = []docSection{
	{name: "memory", title: "memory (in process): raw channel vs keyorder",
		command: "go run ./integration/bench -backend memory -out integration/bench/results"},
	{name: "postgres", title: "PostgreSQL: raw pgx table vs keyorder",
		command: "go run ./integration/cmd/testenv run --only postgres -- go run ./integration/bench -backend postgres -out integration/bench/results"},
	{name: "pubsub", title: "Pub/Sub (Google's emulator): raw client vs keyorder",
		command: "go run ./integration/cmd/testenv run --only pubsub -- go run ./integration/bench -backend pubsub -out integration/bench/results"},
	{name: "sqs", title: "SQS FIFO (ElasticMQ): raw client vs keyorder",
		command: "go run ./integration/cmd/testenv run --only sqs -- go run ./integration/bench -backend sqs -raw-attrs -raw-ko-receive -out integration/bench/results"},
	{name: "pulsar", title: "Pulsar (standalone broker): raw client vs keyorder",
		command: "go run ./integration/cmd/testenv run --only pulsar -- go run ./integration/bench -backend pulsar -out integration/bench/results"},
	{name: "kafka", title: "Kafka (KRaft broker, 8 partitions): raw franz-go vs keyorder",
		command: "go run ./integration/cmd/testenv run --only kafka -- go run ./integration/bench -backend kafka -n 200000 -rounds 2 -alternate -only 'raw,PublishAsync,PublishBatch' -out integration/bench/results"},
	{name: "nats", title: "NATS JetStream (nats-server 2.15.3): raw nats.go jetstream vs keyorder",
		command: "go run ./integration/cmd/testenv run --only nats -- go run ./integration/bench -backend nats -only 'raw,PublishAsync,PublishBatch' -rounds 3 -alternate -out integration/bench/results"},
	{name: "pgbatch", title: "Ordered batches on PostgreSQL: hot keys",
		command: "go run ./integration/cmd/testenv run --only postgres -- go run ./integration/bench -backend pgbatch -out integration/bench/results"},
	{name: "pgtx", title: "Exactly-once effects on PostgreSQL: HandleTx vs the plain ack",
		command: "go run ./integration/cmd/testenv run --only postgres -- go run ./integration/bench -backend pgtx -n 5000 -keys 1000 -rounds 2 -out integration/bench/results"},
	{name: "pgcompact", title: "PostgreSQL compaction",
		command: "go run ./integration/cmd/testenv run --only postgres -- go run ./integration/bench -backend pgcompact -out integration/bench/results"},
	{name: "fairness", title: "Fairness: one tenant at 100x (memory broker)",
		command: "go run ./integration/bench -backend fairness -rounds 3 -out integration/bench/results"},
	{name: "fairness-postgres", title: "Fairness: one tenant at 100x (PostgreSQL)",
		command: "go run ./integration/cmd/testenv run --only postgres -- go run ./integration/bench -backend fairness -fair-backend postgres -rounds 3 -fair-n 50000 -out integration/bench/results"},
	{name: "other", title: "Measurements by other commands", perRow: true},
}

// docsCommand is the command that writes the page.
const docsCommand = "go run ./integration/bench -docs docs/benchmarks.md"

// assembledPrefix starts the line that carries the assembly date, the one
// line of the page that changes when nothing else does.
const assembledPrefix = "Assembled "

var dateRE = regexp.MustCompile(`\b20\d\d-\d\d-\d\d`)

// assembleDocs returns the benchmarks page built from the results files in
// dir, with links relative to the page's directory pageDir. Every section's
// file must exist and name the date it was measured.
func assembleDocs(dir, pageDir string, now time.Time) (string, error) {
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	absPage, err := filepath.Abs(pageDir)
	if err != nil {
		return "", err
	}
	rel, err := filepath.Rel(absPage, absDir)
	if err != nil {
		return "", err
	}
	rel = filepath.ToSlash(rel)
	type body struct {
		sec  docSection
		text string
		date string
		png  bool
	}
	var bodies []body
	var dates []string
	var errs []error
	for _, s := range docSections {
		raw, err := os.ReadFile(filepath.Join(dir, s.name+".md"))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		text := strings.TrimSpace(string(raw))
		// Drop the file's own heading: the page gives each section one.
		if strings.HasPrefix(text, "#") {
			_, text, _ = strings.Cut(text, "\n")
			text = strings.TrimSpace(text)
		}
		found := dateRE.FindAllString(text, -1)
		if len(found) == 0 {
			errs = append(errs, fmt.Errorf("%s.md names no date (YYYY-MM-DD) of its measurement", s.name))
			continue
		}
		dates = append(dates, found...)
		_, statErr := os.Stat(filepath.Join(dir, s.name+".png"))
		bodies = append(bodies, body{sec: s, text: text, date: found[0], png: statErr == nil})
	}
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	slices.Sort(dates)

	var b strings.Builder
	fmt.Fprintf(&b, "<!-- Generated by `%s` from the results tables: edit those or integration/bench/docs.go, not this page. -->\n\n", docsCommand)
	b.WriteString("# Benchmarks\n\n")
	fmt.Fprintf(&b, "%s%s by `%s` (it runs no benchmark: it joins the tables the runs below wrote to [`integration/bench/results`](%s)). Measured %s to %s; each section gives its command and date.\n\n",
		assembledPrefix, now.UTC().Format("2006-01-02"), docsCommand, rel, dates[0], dates[len(dates)-1])
	b.WriteString("All figures come from one 2-core machine, often shared with other work: single runs swing by ±30 % or more between identical runs, " +
		"so compare the ratios within a table, not absolute figures across tables. The load average column says how busy the machine was.\n\n")
	b.WriteString("The side-by-side runs (the first five sections) send the same workload through each broker's raw client and through keyorder " +
		"(20,000 messages of 100 B over 200 and over 1,000 keys; each payload carries its key and per-key sequence number) and count, on both sides, " +
		"per-key order violations and duplicates. The raw sides use each client plainly, with no per-key hold or retry on failure; " +
		"the raw PostgreSQL table and the memory channel keep no per-key order at all, so their violations are expected. `-quick` runs a 2,000-message version, which the tests run against every server so the program cannot rot.\n\n")
	b.WriteString("## Contents\n\n")
	for _, x := range bodies {
		fmt.Fprintf(&b, "- [%s](#%s)\n", x.sec.title, anchor(x.sec.title))
	}
	for _, x := range bodies {
		fmt.Fprintf(&b, "\n## %s\n\n", x.sec.title)
		if !x.sec.perRow {
			fmt.Fprintf(&b, "Measured %s with:\n\n```sh\n%s\n```\n\n", x.date, x.sec.command)
		}
		b.WriteString(x.text)
		b.WriteString("\n")
		if x.png {
			fmt.Fprintf(&b, "\n![%s](%s/%s.png)\n", x.sec.title, rel, x.sec.name)
		}
	}
	return b.String(), nil
}

// anchor returns the fragment GitHub gives a heading.
func anchor(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || ('a' <= r && r <= 'z') || ('0' <= r && r <= '9'):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// writeDocs writes the page to path from the results in dir.
func writeDocs(path, dir string) error {
	page, err := assembleDocs(dir, filepath.Dir(path), time.Now())
	if err != nil {
		return err
	}
	return os.WriteFile(path, []byte(page), 0o644)
}
