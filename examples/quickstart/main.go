// Command quickstart publishes three adjustments to one account and applies
// them in order on the in-memory backend (no server needed). The first
// attempt of the second one fails: under Ordered it is retried before
// anything behind it in its key.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync/atomic"

	"github.com/keyorder/keyorder"
	_ "github.com/keyorder/keyorder/adapters/memory" // registers mem://
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

func main() {
	if err := run(context.Background()); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context) error {
	ctx, stop := context.WithCancel(ctx)
	defer stop()

	// Subscribe first: a subscription receives only what is published
	// after it exists.
	sub, err := subscribe.Open(ctx,
		"mem://ledger.adjustments?subscription=apply-balance&ordering=ordered",
		&subscribe.Config{Workers: 8}) // a key runs one message at a time, in order
	if err != nil {
		return err
	}
	defer sub.Close(context.Background())

	pub, err := publish.Open(ctx, "mem://ledger.adjustments", nil)
	if err != nil {
		return err
	}
	defer pub.Close(context.Background())
	for _, delta := range []string{"-500", "200", "50"} {
		m := &keyorder.Message{Key: "acct-42", Payload: []byte(`{"delta":` + delta + `}`)}
		if _, err := pub.Publish(ctx, m); err != nil {
			return err
		}
	}

	var applied atomic.Int32 // handlers of different keys run concurrently
	return sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
		// nil acks; an error retries; keyorder.Permanent(err) dead-letters.
		if string(d.Payload) == `{"delta":200}` && d.Attempt == 1 {
			fmt.Println(d.Key, string(d.Payload), "attempt 1 failed")
			return errors.New("balance store unavailable") // retried with backoff
		}
		fmt.Println(d.Key, string(d.Payload), "applied at attempt", d.Attempt)
		if applied.Add(1) == 3 {
			stop() // Run returns once the handler has returned
		}
		return nil
	})
}
