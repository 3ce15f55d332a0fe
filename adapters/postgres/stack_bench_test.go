package postgres_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/policy"
	kopublish "github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// BenchmarkStackOrdered measures what a user gets: publish.Publisher and
// subscribe.Subscriber (keyed lanes, batched acks) over the Postgres driver,
// Ordered, 1,000 keys, no-op handler. The driver-level figures (4 raw
// consumers, 1,000 per receive) are in integration/bench.
func BenchmarkStackOrdered(b *testing.B) {
	for _, consumers := range []int{1, 4} {
		b.Run(fmt.Sprintf("consumers=%d", consumers), func(b *testing.B) {
			e := newEnv(b)
			quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
			name := fmt.Sprintf("stack%d", consumers)
			tp := e.topic(name, nil)
			opts := &postgres.Options{MaxBatch: 500}
			e.sub(name, "s", policy.Ordered, opts)
			pub, _ := kopublish.New(tp, &kopublish.Config{Logger: quiet, MaxBatch: 1000})
			ctx := context.Background()
			msgs := make([]*keyorder.Message, 0, 1000)
			for i := 0; i < b.N; i++ {
				msgs = append(msgs, &keyorder.Message{ID: fmt.Sprint(i), Key: fmt.Sprint("key-", i%1000), Payload: make([]byte, 100)})
				if len(msgs) == cap(msgs) || i == b.N-1 {
					if _, err := pub.PublishBatch(ctx, msgs); err != nil {
						b.Fatal(err)
					}
					msgs = msgs[:0]
				}
			}
			var handled atomic.Int64
			done := make(chan struct{})
			n := int64(b.N)
			cpu := startCPU(e)
			b.ResetTimer()
			start := time.Now()
			var subs []*subscribe.Subscriber
			for range consumers {
				drv := e.sub(name, "s", policy.Ordered, opts)
				sub, err := subscribe.New(drv, &subscribe.Config{Workers: 8, MaxOutstanding: 1000, Logger: quiet})
				if err != nil {
					b.Fatal(err)
				}
				subs = append(subs, sub)
				go sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
					if handled.Add(1) == n {
						close(done)
					}
					return nil
				})
			}
			select {
			case <-done:
			case <-time.After(5 * time.Minute):
				b.Fatalf("handled %d of %d", handled.Load(), n)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
			cpu.report(b, b.N)
			b.StopTimer()
			for _, s := range subs {
				s.Close(ctx)
			}
			pub.Close(ctx)
		})
	}
}
