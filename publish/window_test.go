package publish_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/publish"
)

// countTopic counts the batches sent per key, each taking a round trip.
type countTopic struct {
	driver.Topic
	rtt     time.Duration
	mu      sync.Mutex
	batches map[string]int
}

func (c *countTopic) SendBatch(ctx context.Context, ms []*driver.Message) error {
	c.mu.Lock()
	c.batches[ms[0].Key]++
	c.mu.Unlock()
	time.Sleep(c.rtt)
	return c.Topic.SendBatch(ctx, ms)
}

// With the default limits, PublishAsync of 20,000 messages over 1,000 keys
// from one goroutine (the issue-21 workload, 20 messages a key) queues
// them all while the first batches are in flight, so each key goes in at
// most two batches: its first message(s), then the rest. A smaller default
// window (10,000 messages, 10 a key) blocked the publishing goroutine and
// let each key's messages through a few at a time, in about four batches a
// key, twice the raw Pub/Sub client's requests.
func TestPublishAsyncManyKeysDefaultLimitsBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const keys, n = 1000, 20_000
		ct := &countTopic{Topic: memhook.Of(memory.NewBroker()).TopicDriver("t"), rtt: time.Millisecond, batches: map[string]int{}}
		p, err := publish.New(ct, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close(context.Background())
		ctx := context.Background()
		names := make([]string, keys)
		for k := range names {
			names[k] = fmt.Sprint("key-", k)
		}
		rs := make([]*publish.Result, n)
		for i := range n {
			rs[i] = p.PublishAsync(ctx, &keyorder.Message{Key: names[i%keys], Payload: make([]byte, 100)})
		}
		for _, r := range rs {
			if _, err := r.Get(ctx); err != nil {
				t.Fatal(err)
			}
		}
		total, most := 0, 0
		for _, b := range ct.batches {
			total += b
			most = max(most, b)
		}
		if most > 2 {
			t.Errorf("%d batches for %d messages over %d keys, up to %d for one key; want at most 2 a key", total, n, keys, most)
		}
	})
}
