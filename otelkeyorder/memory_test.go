package otelkeyorder_test

import (
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/otelkeyorder"
	"github.com/keyorder/keyorder/policy"
)

// TestMemoryScript runs the script on the memory backend: spans, links,
// the traceparent round trip and metric values.
func TestMemoryScript(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newKit(t)
		br := memory.NewBroker()
		if err := br.CreateSubscription("t", "s", &memory.SubscriptionOptions{Ordering: policy.Ordered}); err != nil {
			t.Fatal(err)
		}
		sdrv, err := memhook.Of(br).SubscriptionDriver("s")
		if err != nil {
			t.Fatal(err)
		}
		res := runScript(t, k, "memory", memhook.Of(br).TopicDriver("t"), sdrv, func(done <-chan struct{}) {
			select {
			case <-done:
			case <-time.After(time.Hour):
				t.Fatal("m3 not handled within an hour of fake time")
			}
		})
		checkScript(t, k, "memory", res)
		// Fake time: m1 was published at the start and its retry runs
		// after the 10ms backoff, so the oldest held message is at least
		// that old.
		if res.heldAgeDuringRetry < 0.010 {
			t.Errorf("oldest held age during m1's retry = %vs, want at least the 10ms backoff", res.heldAgeDuringRetry)
		}
	})
}

// TestParentFromMessage: with Config.ParentFromMessage each process span is
// a child of its message's send span.
func TestParentFromMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newKitWith(t, otelkeyorder.Config{ParentFromMessage: true})
		br := memory.NewBroker()
		if err := br.CreateSubscription("t", "s", &memory.SubscriptionOptions{Ordering: policy.Ordered}); err != nil {
			t.Fatal(err)
		}
		sdrv, err := memhook.Of(br).SubscriptionDriver("s")
		if err != nil {
			t.Fatal(err)
		}
		runScript(t, k, "memory", memhook.Of(br).TopicDriver("t"), sdrv, func(done <-chan struct{}) { <-done })
		sends := map[string]trace.SpanContext{}
		spans := k.spans.Ended()
		for _, s := range spans {
			if s.SpanKind() == trace.SpanKindProducer {
				a := attribute.NewSet(s.Attributes()...)
				id, _ := a.Value("messaging.message.id")
				sends[id.AsString()] = s.SpanContext()
			}
		}
		n := 0
		for _, s := range spans {
			if s.SpanKind() != trace.SpanKindConsumer {
				continue
			}
			n++
			a := attribute.NewSet(s.Attributes()...)
			id, _ := a.Value("messaging.message.id")
			if want := sends[id.AsString()]; s.Parent().SpanID() != want.SpanID() || s.SpanContext().TraceID() != want.TraceID() {
				t.Errorf("process span of %s has parent %v, want the send span %v", id.AsString(), s.Parent(), want)
			}
		}
		if n != 4 {
			t.Errorf("%d process spans, want 4", n)
		}
	})
}
