package subscribe_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/keyorder/keyorder"
	_ "github.com/keyorder/keyorder/adapters/memory" // registers mem://
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// RunBatch hands the handler up to MaxSize consecutive messages of one key,
// in order. The handler reports a failure at message i with
// keyorder.FailedAt(i, err): the messages before i are acknowledged, i is
// retried (here after the delay RetryAfter asks for), and the messages after
// i come back with it, in order, before anything else of the key.
func ExampleSubscriber_RunBatch() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	// A chain of up to 10 messages of a key per receive: a batch of 4 here.
	sub, err := subscribe.Open(ctx, "mem://example.batch?subscription=batch-demo&ordering=ordered&chain=10",
		&subscribe.Config{Batch: &subscribe.BatchConfig{MaxSize: 10}})
	if err != nil {
		panic(err)
	}
	defer sub.Close(context.Background())
	pub, err := publish.Open(ctx, "mem://example.batch", nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close(context.Background())
	for _, p := range []string{"101", "102", "103", "104"} {
		if _, err := pub.Publish(ctx, &keyorder.Message{Key: "acct-42", Payload: []byte(p)}); err != nil {
			panic(err)
		}
	}

	applied := 0
	err = sub.RunBatch(ctx, func(ctx context.Context, ds []*keyorder.Delivery) error {
		var got []string
		for _, d := range ds {
			got = append(got, fmt.Sprintf("%s#%d", d.Payload, d.Attempt))
		}
		fmt.Println("batch:", strings.Join(got, " "))
		for i, d := range ds {
			if string(d.Payload) == "103" && d.Attempt == 1 {
				return keyorder.FailedAt(i, keyorder.RetryAfter(errors.New("balance store busy"), 10*time.Millisecond))
			}
			applied++ // apply d; one transaction per batch would go here
		}
		if applied == 4 {
			stop()
		}
		return nil
	})
	if err != nil {
		panic(err)
	}
	// Output:
	// batch: 101#1 102#1 103#1 104#1
	// batch: 103#2 104#1
}
