package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/keyorder/keyorder/internal/testenv"
)

// The example's run on each backend: publish → handle → retry → dead
// letter, with the spans and metrics checked in what the stdout exporters
// printed.

func TestMemory(t *testing.T) {
	check(t, "memory", fmt.Sprintf("mem://otel-%d", time.Now().UnixNano()))
}

func TestPostgres(t *testing.T) {
	base := testenv.Require(t, testenv.Postgres)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("topic", fmt.Sprintf("otel-%d", time.Now().UnixNano()))
	q.Set("migrate", "true")
	q.Set("create", "true")
	q.Set("schema", "keyorder_otel_example")
	u.RawQuery = q.Encode()
	check(t, "postgresql", u.String())
}

func TestPubSubEmulator(t *testing.T) {
	testenv.Require(t, testenv.PubSub)
	check(t, "gcp_pubsub", fmt.Sprintf("pubsub://otel-project/otel-%d", time.Now().UnixNano()))
}

func TestSQS(t *testing.T) {
	check(t, "aws_sqs", sqsURL(t))
}

func TestPulsar(t *testing.T) {
	base := testenv.Require(t, testenv.Pulsar)
	check(t, "pulsar", fmt.Sprintf("%s/public/default/otel-%d", base, time.Now().UnixNano()))
}

// sqsURL returns the URL of a new FIFO queue on the test ElasticMQ (skipped
// without one).
func sqsURL(t *testing.T) string {
	endpoint := testenv.Require(t, testenv.SQS)
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"} {
		if os.Getenv(k) == "" {
			t.Setenv(k, v)
		}
	}
	q := url.Values{"endpoint": {endpoint}, "region": {"us-east-1"}, "ordering": {"ordered"}}
	return fmt.Sprintf("sqs://otel-%d.fifo?%s", time.Now().UnixNano(), q.Encode())
}

// span is what this test reads of stdouttrace's JSON.
type span struct {
	Name        string
	SpanKind    int
	SpanContext struct{ TraceID, SpanID string }
	Parent      struct{ TraceID, SpanID string }
	Attributes  []struct {
		Key   string
		Value struct{ Value any }
	}
	Links []struct {
		SpanContext struct{ TraceID, SpanID string }
	}
}

func (s *span) attr(key string) string {
	for _, a := range s.Attributes {
		if a.Key == key {
			return fmt.Sprint(a.Value.Value)
		}
	}
	return ""
}

// point is one data point of stdoutmetric's JSON.
type point struct {
	Attributes []struct {
		Key   string
		Value struct{ Value any }
	}
	Value any
	Count any
}

// metrics is what this test reads of stdoutmetric's JSON.
type metrics struct {
	ScopeMetrics []struct {
		Metrics []struct {
			Name string
			Data struct{ DataPoints []point }
		}
	}
}

// check runs the example on topicURL and checks its telemetry: a producer
// span per message and a consumer span per attempt with the right
// outcomes, each linked to its message's producer span through the
// traceparent header the message carried, and the metrics with their
// values.
func check(t *testing.T, system, topicURL string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out, topicURL); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	var spans []span
	var ms []metrics
	dec := json.NewDecoder(bytes.NewReader(out.Bytes()))
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("output is not a stream of JSON objects: %v\n%s", err, out.String())
		}
		if bytes.Contains(raw, []byte(`"ScopeMetrics"`)) {
			var m metrics
			if err := json.Unmarshal(raw, &m); err != nil {
				t.Fatal(err)
			}
			ms = append(ms, m)
			continue
		}
		var s span
		if err := json.Unmarshal(raw, &s); err != nil {
			t.Fatal(err)
		}
		spans = append(spans, s)
	}
	defer func() {
		if t.Failed() {
			t.Logf("output:\n%s", out.String())
		}
	}()

	sends := map[string]span{} // by span ID
	outcomes := map[string]int{}
	byPayloadOutcome := map[string]int{}
	var processes []span
	for _, s := range spans {
		if got := s.attr("messaging.system"); got != system {
			t.Errorf("span %q: messaging.system %q, want %q", s.Name, got, system)
		}
		if s.attr("keyorder.key") != "order-7" {
			t.Errorf("span %q: keyorder.key %q, want order-7", s.Name, s.attr("keyorder.key"))
		}
		switch s.attr("messaging.operation.type") {
		case "send":
			if !strings.HasPrefix(s.Name, "send ") || s.attr("messaging.destination.name") == "" {
				t.Errorf("send span %+v", s)
			}
			sends[s.SpanContext.SpanID] = s
		case "process":
			if !strings.HasPrefix(s.Name, "process ") || s.attr("messaging.consumer.group.name") == "" || s.attr("keyorder.attempt") == "" {
				t.Errorf("process span %+v", s)
			}
			o := s.attr("keyorder.outcome")
			outcomes[o]++
			id := s.attr("messaging.message.id")
			byPayloadOutcome[id[strings.LastIndexByte(id, '-')+1:]+" "+o]++
			processes = append(processes, s)
		default:
			t.Errorf("span %q without messaging.operation.type", s.Name)
		}
	}
	if len(sends) != 3 {
		t.Errorf("%d send spans, want 3", len(sends))
	}
	// ok: ack; flaky: retry then ack; poison: retry then dead letter. A
	// broker may redeliver (at least once), so counts are minimums.
	for _, want := range []string{"ok ack", "flaky retry", "flaky ack", "poison retry", "poison dead_letter"} {
		if byPayloadOutcome[want] < 1 {
			t.Errorf("no process span for %q; got %v", want, byPayloadOutcome)
		}
	}
	for _, p := range processes {
		if len(p.Links) != 1 {
			t.Errorf("process span of %s has %d links, want 1 (to its send span)", p.attr("messaging.message.id"), len(p.Links))
			continue
		}
		l := p.Links[0].SpanContext
		s, ok := sends[l.SpanID]
		if !ok || s.SpanContext.TraceID != l.TraceID || s.attr("messaging.message.id") != p.attr("messaging.message.id") {
			t.Errorf("process span of %s links to %v, not to its message's send span", p.attr("messaging.message.id"), l)
		}
	}

	sum := map[string]float64{}
	seen := map[string]bool{}
	for _, m := range ms {
		for _, sm := range m.ScopeMetrics {
			for _, mt := range sm.Metrics {
				seen[mt.Name] = true
				for _, p := range mt.Data.DataPoints {
					ok := false
					for _, a := range p.Attributes {
						if a.Key == "messaging.system" && fmt.Sprint(a.Value.Value) == system {
							ok = true
						}
					}
					if !ok {
						t.Errorf("metric %s: a data point without messaging.system=%s: %+v", mt.Name, system, p)
					}
					v := p.Value
					if p.Count != nil {
						v = p.Count
					}
					if f, isNum := v.(float64); isNum {
						sum[mt.Name] += f
					}
				}
			}
		}
	}
	for _, name := range []string{"keyorder.published", "keyorder.handled", "messaging.process.duration",
		"keyorder.retries", "keyorder.dead_letters", "keyorder.held_keys", "keyorder.held.oldest_age",
		"keyorder.paused_keys", "keyorder.outstanding"} {
		if !seen[name] {
			t.Errorf("metric %s not exported", name)
		}
	}
	for _, c := range []struct {
		name string
		min  float64
	}{
		{"keyorder.published", 3}, {"keyorder.handled", 5}, {"messaging.process.duration", 5},
		{"keyorder.retries", 2}, {"keyorder.dead_letters", 1},
	} {
		if sum[c.name] < c.min {
			t.Errorf("%s = %v, want at least %v", c.name, sum[c.name], c.min)
		}
	}
	if sum["keyorder.handled"] != float64(len(processes)) {
		t.Errorf("keyorder.handled = %v, but %d process spans", sum["keyorder.handled"], len(processes))
	}
}
