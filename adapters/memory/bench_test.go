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
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// BenchmarkPublishHandleOrdered measures publish→handle throughput of the
// whole stack on the memory backend: b.N messages over 1,000 keys, published
// in batches, consumed by an Ordered subscription with 8 lanes and a no-op
// handler. Its allocations include the benchmark's own message building
// (the Message, its payload, and the ID and key strings, about 6 per
// message); BenchmarkPublishHandleOrderedPrebuilt leaves them out.
func BenchmarkPublishHandleOrdered(b *testing.B) {
	for _, chain := range []int{1, 10} {
		b.Run(fmt.Sprintf("chain=%d", chain), func(b *testing.B) { benchPublishHandle(b, chain, false) })
	}
}

// BenchmarkPublishHandleOrderedPrebuilt is BenchmarkPublishHandleOrdered
// with the messages built before the timer starts, so that its allocations
// per message are the stack's own: what publishing, the broker and the
// subscriber allocate for a message an application has already built.
func BenchmarkPublishHandleOrderedPrebuilt(b *testing.B) {
	for _, chain := range []int{1, 10} {
		b.Run(fmt.Sprintf("chain=%d", chain), func(b *testing.B) { benchPublishHandle(b, chain, true) })
	}
}

func benchPublishHandle(b *testing.B, chain int, prebuilt bool) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	br := memory.NewBroker()
	if err := br.CreateSubscription("t", "s", &memory.SubscriptionOptions{Ordering: policy.Ordered, Chain: chain, MaxBatch: 100}); err != nil {
		b.Fatal(err)
	}
	pub, _ := publish.New(memhook.Of(br).TopicDriver("t"), &publish.Config{Logger: quiet})
	drv, _ := memhook.Of(br).SubscriptionDriver("s")
	sub, _ := subscribe.New(drv, &subscribe.Config{Workers: 8, MaxOutstanding: 512, Logger: quiet})
	var handled atomic.Int64
	done := make(chan struct{})
	n := int64(b.N)
	ctx := context.Background()
	newMessage := func(i int) *keyorder.Message {
		return &keyorder.Message{ID: fmt.Sprint(i), Key: fmt.Sprint("key-", i%1000), Payload: []byte("x")}
	}
	var all []*keyorder.Message
	if prebuilt {
		all = make([]*keyorder.Message, b.N)
		for i := range all {
			all[i] = newMessage(i)
		}
	}
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
		if prebuilt {
			msgs = append(msgs, all[i])
		} else {
			msgs = append(msgs, newMessage(i))
		}
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
}
