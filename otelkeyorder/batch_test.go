package otelkeyorder_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/otelkeyorder"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// TestBatchSpans: under RunBatch every message of a batch gets its own
// process span with its own outcome, and the batch handler's context
// carries a span.
func TestBatchSpans(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		k := newKit(t)
		br := memory.NewBroker()
		if err := br.CreateSubscription("t", "s", &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: memory.InProcess}); err != nil {
			t.Fatal(err)
		}
		sdrv, err := memhook.Of(br).SubscriptionDriver("s")
		if err != nil {
			t.Fatal(err)
		}
		pub, err := publish.New(memhook.Of(br).TopicDriver("t"), &publish.Config{Observer: k.tel.Publisher("memory", "t")})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close(ctx)
		for _, id := range []string{"m1", "m2", "m3"} {
			if _, err := pub.Publish(ctx, &keyorder.Message{ID: id, Key: "k", Payload: []byte(id)}); err != nil {
				t.Fatal(err)
			}
		}
		sub, err := subscribe.New(sdrv, &subscribe.Config{
			Retry:    policy.Retry{MinBackoff: 10 * time.Millisecond, MaxBackoff: 10 * time.Millisecond, NoJitter: true},
			Observer: k.tel.Subscriber("memory", "s"),
			Batch:    &subscribe.BatchConfig{MaxSize: 3},
		})
		if err != nil {
			t.Fatal(err)
		}
		calls := 0
		runErr := make(chan error, 1)
		go func() {
			runErr <- sub.RunBatch(ctx, func(ctx context.Context, ds []*keyorder.Delivery) error {
				if !trace.SpanContextFromContext(ctx).IsValid() {
					return keyorder.Permanent(errors.New("batch handler context carries no span"))
				}
				calls++
				if calls == 1 {
					return keyorder.FailedAt(1, errors.New("m2 fails once"))
				}
				return nil
			})
		}()
		time.Sleep(time.Second)
		synctest.Wait()
		if err := sub.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-runErr; err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, s := range k.spans.Ended() {
			if s.SpanKind() != trace.SpanKindConsumer {
				continue
			}
			a := attribute.NewSet(s.Attributes()...)
			id, _ := a.Value("messaging.message.id")
			out, _ := a.Value(otelkeyorder.AttrOutcome)
			got = append(got, id.AsString()+":"+out.AsString())
		}
		want := []string{"m1:ack", "m2:retry", "m3:released", "m2:ack", "m3:ack"}
		if !slices.Equal(got, want) {
			t.Fatalf("process spans %v, want %v", got, want)
		}
	})
}
