package otelkeyorder_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/otelkeyorder"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// BenchmarkPublishHandleOrdered is adapters/memory's benchmark of the same
// name (b.N messages over 1,000 keys, published in batches, consumed by an
// Ordered subscription with 8 lanes and a no-op handler) with and without
// observers: observe=nil sets none; observe=noop sets otelkeyorder
// observers over OpenTelemetry's no-op providers, what a program gets when
// it wires the hooks but installs no SDK. Both should allocate what the
// uninstrumented benchmark does.
func BenchmarkPublishHandleOrdered(b *testing.B) {
	tel, err := otelkeyorder.New(&otelkeyorder.Config{TracerProvider: tracenoop.NewTracerProvider(), MeterProvider: metricnoop.NewMeterProvider()})
	if err != nil {
		b.Fatal(err)
	}
	for _, chain := range []int{1, 10} {
		for _, observe := range []string{"nil", "noop"} {
			b.Run(fmt.Sprintf("chain=%d/observe=%s", chain, observe), func(b *testing.B) {
				var pobs publish.Observer
				var sobs subscribe.Observer
				if observe == "noop" {
					pobs, sobs = tel.Publisher("memory", "t"), tel.Subscriber("memory", "s")
				}
				quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
				br := memory.NewBroker()
				if err := br.CreateSubscription("t", "s", &memory.SubscriptionOptions{Ordering: policy.Ordered, Chain: chain, MaxBatch: 100}); err != nil {
					b.Fatal(err)
				}
				pub, err := publish.New(memhook.Of(br).TopicDriver("t"), &publish.Config{Logger: quiet, Observer: pobs})
				if err != nil {
					b.Fatal(err)
				}
				drv, err := memhook.Of(br).SubscriptionDriver("s")
				if err != nil {
					b.Fatal(err)
				}
				sub, err := subscribe.New(drv, &subscribe.Config{Workers: 8, MaxOutstanding: 512, Logger: quiet, Observer: sobs})
				if err != nil {
					b.Fatal(err)
				}
				var handled atomic.Int64
				done := make(chan struct{})
				n := int64(b.N)
				ctx := context.Background()
				msgs := make([]*keyorder.Message, 0, 1000)
				b.ReportAllocs()
				b.ResetTimer()
				start := time.Now()
				go sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
					if handled.Add(1) == n {
						close(done)
					}
					return nil
				})
				for i := 0; i < b.N; i++ {
					msgs = append(msgs, &keyorder.Message{ID: fmt.Sprint(i), Key: fmt.Sprint("key-", i%1000), Payload: []byte("x")})
					if len(msgs) == cap(msgs) || i == b.N-1 {
						if _, err := pub.PublishBatch(ctx, msgs); err != nil {
							b.Fatal(err)
						}
						msgs = msgs[:0]
					}
				}
				<-done
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
				b.StopTimer()
				sub.Close(ctx)
				pub.Close(ctx)
			})
		}
	}
}
