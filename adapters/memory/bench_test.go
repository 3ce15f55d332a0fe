package memory_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// BenchmarkPublishHandleOrdered measures publish→handle throughput of the
// whole stack on the memory backend: b.N messages over 1,000 keys, published
// in batches, consumed by an Ordered subscription with 8 lanes and a no-op
// handler.
func BenchmarkPublishHandleOrdered(b *testing.B) {
	for _, chain := range []int{1, 10} {
		b.Run(fmt.Sprintf("chain=%d", chain), func(b *testing.B) {
			quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
			br := memory.NewBroker()
			if err := br.CreateSubscription("t", "s", &memory.SubscriptionConfig{Ordering: policy.Ordered, Chain: chain, MaxBatch: 100}); err != nil {
				b.Fatal(err)
			}
			pub, _ := publish.New(br.OpenTopic("t"), &publish.Config{Logger: quiet})
			drv, _ := br.OpenSubscription("s")
			sub, _ := subscribe.New(drv, &subscribe.Config{Workers: 8, MaxOutstanding: 512, Logger: quiet})
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
			sub.Shutdown(ctx)
			pub.Close(ctx)
		})
	}
}
