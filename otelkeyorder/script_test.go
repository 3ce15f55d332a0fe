package otelkeyorder_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/otelkeyorder"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// kit is an SDK tracer and meter provider recording in memory.
type kit struct {
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	tel    *otelkeyorder.Telemetry
}

func newKit(t *testing.T) *kit { return newKitWith(t, otelkeyorder.Config{}) }

// newKitWith is newKit with cfg's other settings.
func newKitWith(t *testing.T, cfg otelkeyorder.Config) *kit {
	t.Helper()
	k := &kit{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	cfg.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(k.spans))
	cfg.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(k.reader))
	var err error
	k.tel, err = otelkeyorder.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// metric returns the sum of a metric's data points whose attributes include
// want (name=value pairs).
func (k *kit) metric(t *testing.T, name string, want ...attribute.KeyValue) float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := k.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	total := 0.0
	match := func(set attribute.Set) bool {
		for _, kv := range want {
			if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
				return false
			}
		}
		return true
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						total += float64(p.Value)
					}
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						total += float64(p.Value)
					}
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						total += p.Value
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						total += float64(p.Count)
					}
				}
			}
		}
	}
	return total
}

// scriptResult is what a scripted run saw inside the handler.
type scriptResult struct {
	heldDuringRetry        float64 // keyorder.held_keys while m1's retry runs
	outstandingDuringRetry float64
	heldAgeDuringRetry     float64                      // keyorder.held.oldest_age then, seconds
	headers                map[string]map[string]string // by message ID, first attempt
}

// runScript publishes m1, m2, m3 on key k and consumes them: m1 fails once
// then succeeds (one retry), m2 fails permanently (one dead letter), m3
// succeeds. It returns when the subscriber has shut down. wait bounds the
// wait for m3 (on real servers).
func runScript(t *testing.T, k *kit, system string, pdrv driver.Topic, sdrv driver.Subscription, wait func(done <-chan struct{})) scriptResult {
	t.Helper()
	ctx := context.Background()
	pub, err := publish.New(pdrv, &publish.Config{Observer: k.tel.Publisher(system, "t")})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := subscribe.New(sdrv, &subscribe.Config{
		Workers:  2,
		Retry:    policy.Retry{MaxAttempts: 3, MinBackoff: 10 * time.Millisecond, MaxBackoff: 10 * time.Millisecond, NoJitter: true},
		Observer: k.tel.Subscriber(system, "s"),
	})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu  sync.Mutex
		res = scriptResult{headers: map[string]map[string]string{}}
	)
	done := make(chan struct{})
	runErr := make(chan error, 1)
	go func() {
		runErr <- sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
			if !trace.SpanContextFromContext(ctx).IsValid() {
				return keyorder.Permanent(errors.New("handler context carries no span"))
			}
			mu.Lock()
			if _, ok := res.headers[d.ID]; !ok {
				res.headers[d.ID] = d.Headers
			}
			mu.Unlock()
			switch {
			case d.ID == "m1" && d.Attempt == 1:
				return errors.New("m1 fails once")
			case d.ID == "m1":
				res.heldDuringRetry = k.metric(t, otelkeyorder.MetricHeldKeys)
				res.outstandingDuringRetry = k.metric(t, otelkeyorder.MetricOutstanding)
				res.heldAgeDuringRetry = k.metric(t, otelkeyorder.MetricHeldOldestAge)
			case d.ID == "m2":
				return keyorder.Permanent(errors.New("m2 is poison"))
			case d.ID == "m3":
				close(done)
			}
			return nil
		})
	}()
	for _, id := range []string{"m1", "m2", "m3"} {
		if _, err := pub.Publish(ctx, &keyorder.Message{ID: id, Key: "k", Payload: []byte(id)}); err != nil {
			t.Fatal(err)
		}
	}
	wait(done)
	if err := sub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	return res
}

// checkScript checks the spans and metrics of runScript.
func checkScript(t *testing.T, k *kit, system string, res scriptResult) {
	t.Helper()
	sends := map[string]sdktrace.ReadOnlySpan{}
	type attempt struct {
		id      string
		attempt int64
		outcome string
	}
	var got []attempt
	var processes []sdktrace.ReadOnlySpan
	for _, s := range k.spans.Ended() {
		attrs := attribute.NewSet(s.Attributes()...)
		str := func(key string) string { v, _ := attrs.Value(attribute.Key(key)); return v.String() }
		if str("messaging.system") != system {
			t.Errorf("span %q: messaging.system %q, want %q", s.Name(), str("messaging.system"), system)
		}
		switch str("messaging.operation.type") {
		case "send":
			if s.SpanKind() != trace.SpanKindProducer || s.Name() != "send t" || str("messaging.destination.name") != "t" || str("keyorder.key") != "k" {
				t.Errorf("send span %q kind %v attrs %v", s.Name(), s.SpanKind(), s.Attributes())
			}
			sends[str("messaging.message.id")] = s
		case "process":
			if s.SpanKind() != trace.SpanKindConsumer || s.Name() != "process s" || str("messaging.consumer.group.name") != "s" || str("keyorder.key") != "k" {
				t.Errorf("process span %q kind %v attrs %v", s.Name(), s.SpanKind(), s.Attributes())
			}
			a, _ := attrs.Value(otelkeyorder.AttrAttempt)
			got = append(got, attempt{str("messaging.message.id"), a.AsInt64(), str("keyorder.outcome")})
			processes = append(processes, s)
		default:
			t.Errorf("span %q without messaging.operation.type", s.Name())
		}
	}
	if len(sends) != 3 {
		t.Fatalf("send spans for %d messages, want 3", len(sends))
	}
	sort.Slice(got, func(i, j int) bool {
		return fmt.Sprint(got[i].id, got[i].attempt) < fmt.Sprint(got[j].id, got[j].attempt)
	})
	want := []attempt{{"m1", 1, "retry"}, {"m1", 2, "ack"}, {"m2", 1, "dead_letter"}, {"m3", 1, "ack"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("process spans (id attempt outcome) %v, want %v", got, want)
	}
	// Each process span links to its message's send span, carried in the
	// message's traceparent header.
	for _, p := range processes {
		pa := attribute.NewSet(p.Attributes()...)
		id, _ := pa.Value("messaging.message.id")
		send := sends[id.AsString()]
		if send == nil {
			continue
		}
		if links := p.Links(); len(links) != 1 || links[0].SpanContext.TraceID() != send.SpanContext().TraceID() || links[0].SpanContext.SpanID() != send.SpanContext().SpanID() {
			t.Errorf("process span of %s links %v, want the send span %v", id.AsString(), links, send.SpanContext())
		}
		if p.SpanContext().TraceID() == send.SpanContext().TraceID() {
			t.Errorf("process span of %s is in the send span's trace; want a linked trace of its own", id.AsString())
		}
	}
	for id, h := range res.headers {
		tp := h["traceparent"]
		send := sends[id]
		if send == nil || !strings.Contains(tp, send.SpanContext().TraceID().String()) || !strings.Contains(tp, send.SpanContext().SpanID().String()) {
			t.Errorf("message %s arrived with traceparent %q; want the send span's context", id, tp)
		}
	}

	sys := attribute.String("messaging.system", system)
	outcome := func(o string) attribute.KeyValue { return otelkeyorder.AttrOutcome.String(o) }
	checks := []struct {
		name string
		got  float64
		want float64
	}{
		{"published", k.metric(t, otelkeyorder.MetricPublished, sys, attribute.String("messaging.destination.name", "t")), 3},
		{"handled ack", k.metric(t, otelkeyorder.MetricHandled, sys, attribute.String("messaging.consumer.group.name", "s"), outcome("ack")), 2},
		{"handled retry", k.metric(t, otelkeyorder.MetricHandled, sys, outcome("retry")), 1},
		{"handled dead_letter", k.metric(t, otelkeyorder.MetricHandled, sys, outcome("dead_letter")), 1},
		{"duration count", k.metric(t, otelkeyorder.MetricProcessDuration, sys), 4},
		{"retries", k.metric(t, otelkeyorder.MetricRetries, sys), 1},
		{"dead letters", k.metric(t, otelkeyorder.MetricDeadLetters, sys), 1},
		{"held keys during m1's retry", res.heldDuringRetry, 1},
		{"held keys after", k.metric(t, otelkeyorder.MetricHeldKeys, sys), 0},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if res.outstandingDuringRetry < 1 {
		t.Errorf("outstanding during m1's retry = %v, want at least 1", res.outstandingDuringRetry)
	}
}
