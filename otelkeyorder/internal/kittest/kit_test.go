package kittest

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/keyordertest"
	"github.com/keyorder/keyorder/otelkeyorder"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// served runs a publisher and a subscriber on the in-memory backend
// through otelkeyorder and the Prometheus exporter — an ack, a retry, a
// dead letter and a refused publish — and returns the metric families the
// exporter serves, by name.
func served(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	var fams []*dto.MetricFamily
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		exp, err := otelprom.New(otelprom.WithRegisterer(reg))
		if err != nil {
			t.Fatal(err)
		}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
		defer mp.Shutdown(context.Background())
		tel, err := otelkeyorder.New(&otelkeyorder.Config{MeterProvider: mp})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		br := memory.NewBroker()
		if err := br.CreateSubscription("kit", "s", &memory.SubscriptionOptions{Ordering: policy.Ordered}); err != nil {
			t.Fatal(err)
		}
		sub, err := br.OpenSubscription("s", &subscribe.Config{Workers: 2, Observer: tel.Subscriber("memory", "s")})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close(context.Background())
		pub, err := br.OpenTopic("kit", &publish.Config{Observer: tel.Publisher("memory", "kit")})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close(context.Background())
		for _, m := range []*keyorder.Message{
			{Key: "a", Payload: []byte("retry")},
			{Key: "b", Payload: []byte("dead")},
			{Key: "c", Payload: []byte("ok")},
		} {
			if _, err := pub.Publish(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
		// A send the broker fails: a failed publish (error_type) and a
		// paused key.
		stop := keyordertest.FailPublishes(br, "kit", keyordertest.PublishFault{Keys: []string{"p"}})
		if _, err := pub.Publish(ctx, &keyorder.Message{Key: "p", Payload: []byte("x")}); err == nil {
			t.Fatal("the failed send was published")
		}
		stop()
		var mu sync.Mutex
		settled := 0
		done := make(chan struct{})
		var gatherErr error
		go func() {
			<-done
			fams, gatherErr = reg.Gather() // while the subscriber runs: its gauges are registered
			cancel()
		}()
		err = sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case string(d.Payload) == "retry" && d.Attempt == 1:
				return errors.New("first attempt fails")
			case string(d.Payload) == "dead":
				settled++
				if settled == 3 {
					defer close(done)
				}
				return keyorder.Permanent(errors.New("poison"))
			}
			settled++
			if settled == 3 {
				close(done)
			}
			return nil
		})
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		if gatherErr != nil {
			t.Fatal(gatherErr)
		}
	})
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// query is one PromQL expression of the kit, with where it comes from.
type query struct{ where, expr string }

// kitQueries returns the PromQL of dashboard.json (targets and template
// variables) and alerts.yml (expr, one line or a block).
func kitQueries(t *testing.T) []query {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "kit", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct {
				Name  string
				Query json.RawMessage
			}
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	var out []query
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			out = append(out, query{"dashboard panel " + p.Title, tg.Expr})
		}
	}
	for _, v := range dash.Templating.List {
		var q struct{ Query string }
		if json.Unmarshal(v.Query, &q) == nil && q.Query != "" {
			out = append(out, query{"dashboard variable " + v.Name, q.Query})
		}
	}
	rules, err := os.ReadFile(filepath.Join("..", "..", "kit", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(rules), "\n")
	alert := ""
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if a, ok := strings.CutPrefix(l, "- alert: "); ok {
			alert = a
		}
		e, ok := strings.CutPrefix(l, "expr: ")
		if !ok {
			continue
		}
		if e == "|" {
			indent := len(lines[i+1]) - len(strings.TrimLeft(lines[i+1], " "))
			var b []string
			for i+1 < len(lines) && (strings.TrimSpace(lines[i+1]) == "" || len(lines[i+1])-len(strings.TrimLeft(lines[i+1], " ")) >= indent) {
				i++
				b = append(b, strings.TrimSpace(lines[i]))
			}
			e = strings.Join(b, " ")
		}
		out = append(out, query{"alert " + alert, e})
	}
	if len(out) < 10 {
		t.Fatalf("found %d queries in the kit: the parsing is broken", len(out))
	}
	return out
}

var (
	// labelListRE matches by (...), without (...), on (...), ignoring
	// (...), group_left (...) and group_right (...).
	labelListRE = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)`)
	// matchersRE matches a selector's braces.
	matchersRE = regexp.MustCompile(`\{([^{}]*)\}`)
	// matcherRE matches one label matcher.
	matcherRE = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	// labelValuesRE matches Grafana's label_values(metric..., label).
	labelValuesRE = regexp.MustCompile(`label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)`)
	// nameRE matches a keyorder or messaging metric name.
	nameRE = regexp.MustCompile(`\b(?:keyorder|messaging)_[a-z0-9_]+\b`)
	// counterCtxRE matches a name as the argument of a function that
	// takes a counter.
	counterCtxRE = regexp.MustCompile(`\b(?:rate|irate|increase)\(\s*$`)
)

// use is one metric a query names, and whether a rate-like function
// takes it.
type use struct {
	name    string
	counter bool
}

// parse returns the metrics, the label names and the label matchers
// (name → values compared with =) of a query.
func parse(expr string) (uses []use, labels []string, eq map[string][]string) {
	eq = map[string][]string{}
	rest := expr
	if m := labelValuesRE.FindStringSubmatch(rest); m != nil {
		labels = append(labels, m[2])
		rest = m[1]
	}
	for _, m := range labelListRE.FindAllStringSubmatch(rest, -1) {
		for _, l := range strings.Split(m[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				labels = append(labels, l)
			}
		}
	}
	rest = labelListRE.ReplaceAllString(rest, " ")
	for _, m := range matchersRE.FindAllStringSubmatch(rest, -1) {
		for _, mm := range matcherRE.FindAllStringSubmatch(m[1], -1) {
			labels = append(labels, mm[1])
			if mm[2] == "=" && mm[3] != "" && !strings.Contains(mm[3], "$") {
				eq[mm[1]] = append(eq[mm[1]], mm[3])
			}
		}
	}
	// Blank the braces, keeping offsets, so a label is never taken for a
	// metric.
	rest = matchersRE.ReplaceAllStringFunc(rest, func(s string) string { return strings.Repeat(" ", len(s)) })
	for _, loc := range nameRE.FindAllStringIndex(rest, -1) {
		uses = append(uses, use{rest[loc[0]:loc[1]], counterCtxRE.MatchString(rest[:loc[0]])})
	}
	return uses, labels, eq
}

// family returns the served family a name refers to (a histogram's
// _bucket, _sum and _count series included).
func family(fams map[string]*dto.MetricFamily, name string) (*dto.MetricFamily, bool) {
	if f, ok := fams[name]; ok {
		return f, true
	}
	for _, s := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, s); ok {
			if f, ok := fams[base]; ok && f.GetType() == dto.MetricType_HISTOGRAM {
				return f, true
			}
		}
	}
	return nil, false
}

// check returns the problems of the kit's queries against the served
// families and the outcome names.
func check(qs []query, fams map[string]*dto.MetricFamily, outcomes []string) []string {
	var bad []string
	for _, q := range qs {
		uses, labels, eq := parse(q.expr)
		if len(uses) == 0 {
			bad = append(bad, q.where+": names no keyorder metric: "+q.expr)
		}
		have := map[string]bool{}
		for _, u := range uses {
			f, ok := family(fams, u.name)
			if !ok {
				bad = append(bad, q.where+": "+u.name+" is not served by the exporter")
				continue
			}
			counterLike := f.GetType() == dto.MetricType_COUNTER || f.GetType() == dto.MetricType_HISTOGRAM
			switch {
			case u.counter && !counterLike:
				bad = append(bad, q.where+": rate/increase of "+u.name+", a "+f.GetType().String())
			case !u.counter && f.GetType() == dto.MetricType_COUNTER && !strings.HasPrefix(q.expr, "label_values("):
				bad = append(bad, q.where+": "+u.name+" is a counter; take its rate or increase")
			}
			if f.GetType() == dto.MetricType_HISTOGRAM {
				have["le"] = true
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					have[l.GetName()] = true
				}
			}
		}
		for _, l := range labels {
			if !have[l] {
				bad = append(bad, q.where+": label "+l+" is on none of its metrics")
			}
		}
		for _, v := range eq["keyorder_outcome"] {
			if !slices.Contains(outcomes, v) {
				bad = append(bad, q.where+": keyorder_outcome "+v+" is not an outcome")
			}
		}
	}
	return bad
}

func outcomeNames() []string {
	var out []string
	for o := subscribe.OutcomeAck; o <= subscribe.OutcomeLeaseLost; o++ {
		out = append(out, o.String())
	}
	return out
}

// TestKitNamesServedMetrics: every metric and label the dashboard and the
// alerting rules name is served by OpenTelemetry's Prometheus exporter
// from otelkeyorder's instruments, rates are taken of counters only, and
// the dashboard shows every keyorder metric the exporter serves.
func TestKitNamesServedMetrics(t *testing.T) {
	fams := served(t)
	var names []string
	for n := range fams {
		if strings.HasPrefix(n, "keyorder_") || strings.HasPrefix(n, "messaging_") {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	t.Logf("served: %v", names)
	// The two instruments in seconds are served with the unit in their
	// names; the rules' thresholds are in seconds.
	for _, n := range []string{"keyorder_held_oldest_age_seconds", "messaging_process_duration_seconds"} {
		if _, ok := fams[n]; !ok {
			t.Errorf("%s not served (otelkeyorder's unit or name changed?); served: %v", n, names)
		}
	}
	qs := kitQueries(t)
	for _, b := range check(qs, fams, outcomeNames()) {
		t.Error(b)
	}
	shown := map[string]bool{}
	for _, q := range qs {
		if !strings.HasPrefix(q.where, "dashboard") {
			continue
		}
		uses, _, _ := parse(q.expr)
		for _, u := range uses {
			if f, ok := family(fams, u.name); ok {
				shown[f.GetName()] = true
			}
		}
	}
	for _, n := range names {
		if !shown[n] {
			t.Errorf("the dashboard shows no panel of %s", n)
		}
	}
}

// TestKitCheckFindsMistakes runs the check on queries of its own: a
// misspelt metric, a unit missing from a name, a rate of a gauge, a bare
// counter, an unknown label and an unknown outcome are each found.
func TestKitCheckFindsMistakes(t *testing.T) {
	fams := served(t)
	qs := []query{
		{"ok", `sum by (messaging_consumer_group_name) (rate(keyorder_retries_total{messaging_system="memory"}[5m]))`},
		{"ok histogram", `histogram_quantile(0.99, sum by (le) (rate(messaging_process_duration_seconds_bucket[5m])))`},
		{"misspelt", `keyorder_held_key > 0`},
		{"no unit", `max(keyorder_held_oldest_age) > 600`},
		{"rate of gauge", `rate(keyorder_held_keys[5m])`},
		{"bare counter", `keyorder_dead_letters_total > 0`},
		{"label", `sum by (subscription) (keyorder_held_keys)`},
		{"outcome", `increase(keyorder_handled_total{keyorder_outcome="lost"}[5m])`},
	}
	got := check(qs, fams, outcomeNames())
	want := []string{
		"misspelt: keyorder_held_key is not served by the exporter",
		"no unit: keyorder_held_oldest_age is not served by the exporter",
		"rate of gauge: rate/increase of keyorder_held_keys, a GAUGE",
		"bare counter: keyorder_dead_letters_total is a counter; take its rate or increase",
		"label: label subscription is on none of its metrics",
		"outcome: keyorder_outcome lost is not an outcome",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
