package publish_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/publish"
)

// latencyTopic adds a broker round trip to every SendBatch.
type latencyTopic struct {
	driver.Topic
	rtt time.Duration
}

func (l latencyTopic) SendBatch(ctx context.Context, ms []*driver.Message) error {
	time.Sleep(l.rtt)
	return l.Topic.SendBatch(ctx, ms)
}

// BenchmarkPublish compares, on the memory backend (a topic without
// subscriptions, so only the publishing path is measured), b.N messages of
// 100 B over 200 keys published:
//
//   - Sync: with Publish from one goroutine per key (each message waits for
//     its round trip before the key's next);
//   - Async: with PublishAsync from one goroutine, every Result waited for
//     at the end (the outstanding limits bound the backlog);
//
// without a round trip and with a 1 ms one per SendBatch. It reports
// msgs/s; allocs/op is per message.
func BenchmarkPublish(b *testing.B) {
	const keys = 200
	payload := make([]byte, 100)
	keyNames := make([]string, keys)
	for i := range keyNames {
		keyNames[i] = fmt.Sprintf("key-%03d", i)
	}
	for _, rtt := range []time.Duration{0, time.Millisecond} {
		open := func(b *testing.B) *publish.Publisher {
			var drv driver.Topic = memhook.Of(memory.NewBroker()).TopicDriver("t")
			if rtt > 0 {
				drv = latencyTopic{drv, rtt}
			}
			p, err := publish.New(drv, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { p.Close(context.Background()) })
			return p
		}
		b.Run(fmt.Sprintf("rtt=%v/Sync", rtt), func(b *testing.B) {
			p := open(b)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			var wg sync.WaitGroup
			for k := range keys {
				n := b.N / keys
				if k < b.N%keys {
					n++
				}
				wg.Go(func() {
					for range n {
						if _, err := p.Publish(ctx, &keyorder.Message{Key: keyNames[k], Payload: payload}); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
		b.Run(fmt.Sprintf("rtt=%v/Async", rtt), func(b *testing.B) {
			p := open(b)
			ctx := context.Background()
			rs := make([]*publish.Result, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				rs[i] = p.PublishAsync(ctx, &keyorder.Message{Key: keyNames[i%keys], Payload: payload})
			}
			for _, r := range rs {
				if _, err := r.Get(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}
