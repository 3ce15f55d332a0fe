package pubsub_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/pubsub"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// TestGracefulStopKeepsKeyOrder (issue 28, the guarantee table's Pub/Sub
// graceful-stop row): a1 fails with a RetryAfter while a2 and a3 of its
// key wait behind it in the process; the subscriber stops gracefully (a1
// goes back through Return with its remaining delay, a2 and a3 through
// Release) and a new subscriber takes over the subscription. The key's
// first completions are a1, a2, a3, a1's second run comes no earlier than
// its delay, and neither a2 nor a3 starts before a1 has completed. On
// Google's emulator.
func TestGracefulStopKeepsKeyOrder(t *testing.T) {
	client := emulatorClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	topicID, subID := uniqueID("gorder"), uniqueID("gorder-s")
	if err := pubsub.CreateTopic(ctx, client, topicID); err != nil {
		t.Fatal(err)
	}
	opts := &pubsub.SubscriptionOptions{Ordering: policy.Ordered, AckDeadline: pubsub.MinAckDeadline}
	if err := pubsub.CreateSubscription(ctx, client, topicID, subID, opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteAll(client, topicID, subID) })
	pub, err := pubsub.OpenTopic(ctx, client, topicID, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close(context.Background()) })
	for _, p := range []string{"a1", "a2", "a3"} {
		if _, err := pub.Publish(ctx, &keyorder.Message{ID: p, Key: "A", Payload: []byte(p)}); err != nil {
			t.Fatal(err)
		}
	}

	const delay = 3 * time.Second
	var mu sync.Mutex
	var events []string // "start a1@1", "done a1"
	var a1Failed time.Time
	var a1Again time.Time
	h := func(ctx context.Context, d *keyorder.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, fmt.Sprintf("start %s", d.Payload))
		if string(d.Payload) == "a1" {
			if a1Failed.IsZero() {
				a1Failed = time.Now()
				return keyorder.RetryAfter(errors.New("not yet"), delay)
			}
			if a1Again.IsZero() {
				a1Again = time.Now()
			}
		}
		events = append(events, fmt.Sprintf("done %s", d.Payload))
		return nil
	}
	cfg := func() *subscribe.Config {
		return &subscribe.Config{
			Workers: 2, ShutdownTimeout: 5 * time.Second,
			Retry: policy.Retry{MaxAttempts: 5, MinBackoff: delay, MaxBackoff: delay, NoJitter: true},
		}
	}
	run := func(sub *subscribe.Subscriber) chan error {
		done := make(chan error, 1)
		go func() { done <- sub.Run(context.Background(), h) }()
		return done
	}
	snapshot := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(events)
	}
	waitUntil := func(what string, ok func([]string) bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for !ok(snapshot()) {
			if time.Now().After(deadline) {
				t.Fatalf("after 60 s, %s has not happened; events %v", what, snapshot())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	first, err := pubsub.OpenSubscription(ctx, client, subID, opts, cfg())
	if err != nil {
		t.Fatal(err)
	}
	done := run(first)
	waitUntil("a1's first run", func(ev []string) bool { return slices.Contains(ev, "start a1") })
	// a2 and a3 came with a1 or come while it waits: give the stream a
	// moment to bring them, so that the stop hands them back.
	time.Sleep(500 * time.Millisecond)
	cctx, ccancel := context.WithTimeout(ctx, 15*time.Second)
	err = first.Close(cctx)
	ccancel()
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if ev := snapshot(); !slices.Equal(ev, []string{"start a1"}) {
		t.Fatalf("before the stop: events %v, want only a1's failed run (a2, a3 held behind it)", ev)
	}

	second, err := pubsub.OpenSubscription(ctx, client, subID, opts, cfg())
	if err != nil {
		t.Fatal(err)
	}
	done = run(second)
	waitUntil("a3's completion", func(ev []string) bool { return slices.Contains(ev, "done a3") })
	cctx, ccancel = context.WithTimeout(ctx, 15*time.Second)
	err = second.Close(cctx)
	ccancel()
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ev := snapshot()
	var firstDone []string
	seen := map[string]bool{}
	for _, e := range ev[1:] {
		var verb, p string
		fmt.Sscan(e, &verb, &p)
		if verb == "start" {
			if p != "a1" && !seen["a1"] {
				t.Fatalf("%s started before a1 completed after the restart; events %v", p, ev)
			}
		} else if !seen[p] {
			seen[p] = true
			firstDone = append(firstDone, p)
		}
	}
	if !slices.Equal(firstDone, []string{"a1", "a2", "a3"}) {
		t.Fatalf("first completions %v, want [a1 a2 a3]; events %v", firstDone, ev)
	}
	mu.Lock()
	defer mu.Unlock()
	if gap := a1Again.Sub(a1Failed); gap < delay {
		t.Fatalf("a1 ran again %v after it failed, before its retry delay of %v", gap, delay)
	}
	t.Logf("events %v; a1's second run %v after its failure", ev, a1Again.Sub(a1Failed).Round(time.Millisecond))
}
