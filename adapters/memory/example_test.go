package memory_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// mem:// URLs need no server. A topic has any number of subscriptions, each
// with its own policy, and each receives everything published after it
// exists. The broker plays either shape of real brokers: hold=native holds a
// failed message's key in the broker (as PostgreSQL and SQS do), and
// hold=inprocess leaves it to the subscriber (as with Pub/Sub and Pulsar).
// The guarantee is the same.
func Example() {
	ctx := context.Background()

	// Subscriptions first: each receives only what is published after it exists.
	holds := []string{"native", "inprocess"}
	var subs []*subscribe.Subscriber
	for _, hold := range holds {
		sub, err := subscribe.Open(ctx,
			"mem://example.memory?subscription=memory-"+hold+"&ordering=ordered&hold="+hold, nil)
		if err != nil {
			panic(err)
		}
		defer sub.Close(context.Background())
		subs = append(subs, sub)
	}

	pub, err := publish.Open(ctx, "mem://example.memory", nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close(ctx)
	for _, p := range []string{"101", "102"} {
		if _, err := pub.Publish(ctx, &keyorder.Message{Key: "acct-42", Payload: []byte(p)}); err != nil {
			panic(err)
		}
	}

	for i, sub := range subs {
		runCtx, stop := context.WithCancel(ctx)
		var seen []string // one key: its handlings never overlap under Ordered
		err := sub.Run(runCtx, func(ctx context.Context, d *keyorder.Delivery) error {
			seen = append(seen, fmt.Sprintf("%s#%d", d.Payload, d.Attempt))
			if string(d.Payload) == "101" && d.Attempt == 1 {
				return errors.New("fails once")
			}
			if string(d.Payload) == "102" {
				stop()
			}
			return nil
		})
		stop()
		if err != nil {
			panic(err)
		}
		fmt.Printf("hold=%s (broker holds the key: %v): %s\n",
			holds[i], sub.Capabilities().NativeHold, strings.Join(seen, " "))
	}
	// Output:
	// hold=native (broker holds the key: true): 101#1 101#2 102#1
	// hold=inprocess (broker holds the key: false): 101#1 101#2 102#1
}

// A Broker of its own, rather than the one mem:// URLs share, keeps a test
// apart from every other: create the subscription, then wrap the drivers
// with publish.New and subscribe.New. Here a message published with
// NotBefore holds its key until then, so under Ordered the one behind it
// waits too.
func ExampleBroker() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	b := memory.NewBroker()
	if err := b.CreateSubscription("ledger", "apply-balance",
		&memory.SubscriptionOptions{Ordering: policy.Ordered}); err != nil {
		panic(err)
	}
	sub, err := b.OpenSubscription("apply-balance", nil)
	if err != nil {
		panic(err)
	}
	defer sub.Close(context.Background())
	pub, err := b.OpenTopic("ledger", nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close(context.Background())

	const delay = 100 * time.Millisecond
	notBefore := time.Now().Add(delay)
	for _, m := range []*keyorder.Message{
		{Key: "acct-42", Payload: []byte("101"), NotBefore: notBefore},
		{Key: "acct-42", Payload: []byte("102")},
	} {
		if _, err := pub.Publish(ctx, m); err != nil {
			panic(err)
		}
	}

	err = sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
		fmt.Printf("%s handled; not before its time: %v\n", d.Payload, !time.Now().Before(notBefore))
		if string(d.Payload) == "102" {
			stop()
		}
		return nil
	})
	if err != nil {
		panic(err)
	}
	// Output:
	// 101 handled; not before its time: true
	// 102 handled; not before its time: true
}
