package sqs_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/sqs"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// TestThroughput measures publish and handle rates through the portable
// layer. It runs when KEYORDER_SQS_THROUGHPUT is set (to the message count).
func TestThroughput(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KEYORDER_SQS_THROUGHPUT"))
	if n <= 0 {
		t.Skip("set KEYORDER_SQS_THROUGHPUT=N to measure")
	}
	for _, oldest := range []bool{false, true} {
		t.Run(fmt.Sprintf("OldestFirst=%v", oldest), func(t *testing.T) {
			throughput(t, n, &sqs.Options{Ordering: policy.Ordered, WaitTime: time.Second, OldestFirst: oldest})
		})
	}
}

func throughput(t *testing.T, n int, opts *sqs.Options) {
	const keys = 200
	_, _, topic, sub := openWith(t, opts)
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	p, err := publish.New(topic, &publish.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ms := make([]*keyorder.Message, n)
	for i := range ms {
		ms[i] = &keyorder.Message{Key: fmt.Sprintf("k%03d", i%keys), Payload: []byte(fmt.Sprintf("%d|%d", i%keys, i/keys))}
	}
	start := time.Now()
	// One call per 1000: the publisher sends each key's messages in order,
	// one batch per key in flight, keys concurrently.
	for i := 0; i < n; i += 1000 {
		if _, err := p.PublishBatch(context.Background(), ms[i:min(i+1000, n)]); err != nil {
			t.Fatal(err)
		}
	}
	pubDur := time.Since(start)
	p.Close(context.Background())

	var done atomic.Int64
	var mu sync.Mutex
	last := map[string]int{}
	bad := 0
	s, err := subscribe.New(sub, &subscribe.Config{Workers: 64, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	go s.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
		var k, seq int
		fmt.Sscanf(string(d.Payload), "%d|%d", &k, &seq)
		mu.Lock()
		if prev, ok := last[d.Key]; ok && seq != prev+1 || !ok && seq != 0 {
			bad++
		}
		last[d.Key] = seq
		mu.Unlock()
		done.Add(1)
		return nil
	})
	for done.Load() < int64(n) && time.Since(start) < 5*time.Minute {
		time.Sleep(10 * time.Millisecond)
	}
	subDur := time.Since(start)
	cancel()
	s.Shutdown(context.Background())
	t.Logf("%d messages over %d keys: publish %.0f msgs/s (%v), handle %.0f msgs/s (%v), out of order %d",
		n, keys, float64(n)/pubDur.Seconds(), pubDur, float64(done.Load())/subDur.Seconds(), subDur, bad)
	if bad > 0 || done.Load() != int64(n) {
		t.Fatalf("handled %d of %d, %d out of order", done.Load(), n, bad)
	}
}
