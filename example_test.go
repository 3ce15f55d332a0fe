package keyorder_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/keyorder/keyorder"
	_ "github.com/keyorder/keyorder/adapters/memory" // registers mem://
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// A downstream service says "try again in 200ms": the handler returns
// RetryAfter. Under Ordered the key is held for the delay, so nothing behind
// the message runs first (other keys are not held). The retry counts as an
// attempt, so a handler cannot hold a key forever.
func ExampleRetryAfter() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	// Subscribe first: a subscription receives only what is published after it exists.
	sub, err := subscribe.Open(ctx, "mem://example.retryafter?subscription=retryafter-demo&ordering=ordered", nil)
	if err != nil {
		panic(err)
	}
	defer sub.Close()
	pub, err := publish.Open(ctx, "mem://example.retryafter", nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close(context.Background())
	for _, p := range []string{"101", "102"} {
		if _, err := pub.Publish(ctx, &keyorder.Message{Key: "acct-42", Payload: []byte(p)}); err != nil {
			panic(err)
		}
	}

	const delay = 200 * time.Millisecond
	var failedAt time.Time // one key: its handlings never overlap under Ordered
	err = sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
		switch {
		case string(d.Payload) == "101" && d.Attempt == 1:
			failedAt = time.Now()
			fmt.Println("101 attempt 1: rate limited, retry after", delay)
			return keyorder.RetryAfter(errors.New("rate limited"), delay)
		case string(d.Payload) == "101":
			fmt.Println("101 attempt", d.Attempt, "applied; waited the delay:", time.Since(failedAt) >= delay)
		default:
			fmt.Println(string(d.Payload), "attempt", d.Attempt, "applied")
			stop()
		}
		return nil
	})
	if err != nil {
		panic(err)
	}
	// Output:
	// 101 attempt 1: rate limited, retry after 200ms
	// 101 attempt 2 applied; waited the delay: true
	// 102 attempt 1 applied
}

// A message that can never succeed (here, malformed JSON) is dead-lettered
// at once with Permanent, without spending its retry budget, and its key
// goes on with the next message. The dead letter keeps its reason and
// attempts; Subscriber.Redrive puts it back once the cause is fixed.
func ExamplePermanent() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	sub, err := subscribe.Open(ctx, "mem://example.permanent?subscription=permanent-demo&ordering=ordered", nil)
	if err != nil {
		panic(err)
	}
	defer sub.Close()
	pub, err := publish.Open(ctx, "mem://example.permanent", nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close(context.Background())
	for _, p := range []string{`{"delta":-500}`, `{"delta":`, `{"delta":200}`} {
		if _, err := pub.Publish(ctx, &keyorder.Message{Key: "acct-42", Payload: []byte(p)}); err != nil {
			panic(err)
		}
	}

	var applied atomic.Int32
	err = sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
		var adj struct{ Delta int }
		if err := json.Unmarshal(d.Payload, &adj); err != nil {
			fmt.Printf("%s attempt %d: malformed\n", d.Payload, d.Attempt)
			return keyorder.Permanent(fmt.Errorf("malformed adjustment: %w", err))
		}
		fmt.Printf("%s attempt %d: applied\n", d.Payload, d.Attempt)
		if applied.Add(1) == 2 {
			stop()
		}
		return nil
	})
	if err != nil {
		panic(err)
	}

	dead, err := sub.DeadLetters(context.Background(), 0)
	if err != nil {
		panic(err)
	}
	for _, dl := range dead {
		fmt.Printf("dead letter %s after %d attempt(s): %s\n", dl.Message.Payload, dl.Attempts, dl.Reason)
	}
	// Output:
	// {"delta":-500} attempt 1: applied
	// {"delta": attempt 1: malformed
	// {"delta":200} attempt 1: applied
	// dead letter {"delta": after 1 attempt(s): permanent: malformed adjustment: unexpected end of JSON input
}
