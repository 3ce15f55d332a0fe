package pubsub_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	syncpkg "sync"
	"testing"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/pubsub"
	"github.com/keyorder/keyorder/publish"
)

// TestAsyncPublishVsRaw measures, on the Pub/Sub emulator, N messages of
// 100 B over 200 keys published from one goroutine by the raw v2 client
// (ordering enabled, Publish then every result's Get), by keyorder's
// PublishAsync (then every Result's Get) and by keyorder's Publish from one
// goroutine per key, in alternating rounds, and logs the medians and their
// ratios. It runs when KEYORDER_ASYNC_BENCH is set to
// N (the workload is 20000); rounds from KEYORDER_ASYNC_ROUNDS
// (default 3).
func TestAsyncPublishVsRaw(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KEYORDER_ASYNC_BENCH"))
	if n <= 0 {
		t.Skip("set KEYORDER_ASYNC_BENCH=N to measure")
	}
	rounds, _ := strconv.Atoi(os.Getenv("KEYORDER_ASYNC_ROUNDS"))
	rounds = max(rounds, 1)
	client := emulatorClient(t)
	ctx := context.Background()
	const keys = 200
	payload := make([]byte, 100)
	key := func(i int) string { return fmt.Sprintf("key-%03d", i%keys) }
	newTopic := func() string {
		id := uniqueID("bench")
		if err := pubsub.CreateTopic(ctx, client, id); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { deleteAll(client, id, id+"-none") })
		return id
	}
	raw := func() float64 {
		p := client.Publisher(newTopic())
		p.EnableMessageOrdering = true
		defer p.Stop()
		rs := make([]*gpubsub.PublishResult, n)
		start := time.Now()
		for i := range n {
			rs[i] = p.Publish(ctx, &gpubsub.Message{Data: payload, OrderingKey: key(i)})
		}
		for _, r := range rs {
			if _, err := r.Get(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return float64(n) / time.Since(start).Seconds()
	}
	ours := func() float64 {
		drv, err := pubsub.OpenTopic(ctx, client, newTopic(), nil)
		if err != nil {
			t.Fatal(err)
		}
		p, err := publish.New(drv, &publish.Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close(ctx)
		rs := make([]*publish.Result, n)
		start := time.Now()
		for i := range n {
			rs[i] = p.PublishAsync(ctx, &keyorder.Message{Key: key(i), Payload: payload})
		}
		for _, r := range rs {
			if _, err := r.Get(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return float64(n) / time.Since(start).Seconds()
	}
	// The synchronous form, for comparison: Publish from one goroutine per
	// key (the 0.22x of issue 11).
	sync := func() float64 {
		drv, err := pubsub.OpenTopic(ctx, client, newTopic(), nil)
		if err != nil {
			t.Fatal(err)
		}
		p, err := publish.New(drv, &publish.Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close(ctx)
		var wg syncpkg.WaitGroup
		start := time.Now()
		for k := range keys {
			wg.Go(func() {
				for i := k; i < n; i += keys {
					if _, err := p.Publish(ctx, &keyorder.Message{Key: key(i), Payload: payload}); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		return float64(n) / time.Since(start).Seconds()
	}
	var rawRates, ourRates, syncRates []float64
	for r := range rounds {
		rawRates = append(rawRates, raw())
		ourRates = append(ourRates, ours())
		syncRates = append(syncRates, sync())
		t.Logf("round %d: raw %.0f msgs/s, keyorder PublishAsync %.0f msgs/s, keyorder Publish per key %.0f msgs/s", r+1, rawRates[r], ourRates[r], syncRates[r])
	}
	rm, om, sm := median(rawRates), median(ourRates), median(syncRates)
	t.Logf("Pub/Sub emulator, %d x 100 B over %d keys, median of %d: raw (one goroutine) %.0f msgs/s, keyorder PublishAsync (one goroutine) %.0f msgs/s = %.2fx, keyorder Publish (one goroutine per key) %.0f msgs/s = %.2fx",
		n, keys, rounds, rm, om, om/rm, sm, sm/rm)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
