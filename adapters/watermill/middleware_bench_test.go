package watermill_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/keyorder/keyorder"
	wmk "github.com/keyorder/keyorder/adapters/watermill"
	"github.com/keyorder/keyorder/policy"
)

// BenchmarkMiddleware measures the middleware's own cost per message: the
// wrapped no-op handler called as a router calls it, one message at a time
// (as over gochannel, whose subscriber waits for each ack) and from
// GOMAXPROCS goroutines at once (parallel), against the bare handler.
func BenchmarkMiddleware(b *testing.B) {
	msgs := make([]*message.Message, 1000)
	for i := range msgs {
		msgs[i] = message.NewMessage(strconv.Itoa(i), []byte("x"))
		msgs[i].Metadata.Set(keyorder.HeaderPartitionKey, "key-"+strconv.Itoa(i))
	}
	noop := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	for _, mw := range []string{"none", "keyorder"} {
		h := message.HandlerFunc(noop)
		if mw == "keyorder" {
			km, err := wmk.NewMiddleware(policy.Ordered, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer km.Close(context.Background())
			h = km.Middleware(h)
		}
		b.Run("middleware="+mw+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, err := h(msgs[i%len(msgs)]); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("middleware="+mw+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for i := 0; pb.Next(); i++ {
					if _, err := h(msgs[i%len(msgs)]); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
