package pulsar_test

import (
	"context"

	"github.com/keyorder/keyorder"
	_ "github.com/keyorder/keyorder/adapters/pulsar" // registers pulsar:// and pulsar+ssl://
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// The same program on Apache Pulsar, chosen by URL: the key travels as the
// message key and ordering key, consumed from a Key_Shared subscription.
// Compile-only: it needs a broker. With admin= the driver creates the topic
// and checks an existing subscription's policy.
func Example() {
	ctx := context.Background()

	// The subscription first: it receives only what is published after it
	// exists. Opening creates the subscription;
	// Pulsar starts a new one at the oldest message the topic still stores.
	sub, err := subscribe.Open(ctx,
		"pulsar://broker:6650/public/default/ledger?subscription=apply-balance&ordering=ordered&admin=http://broker:8080",
		&subscribe.Config{Workers: 8})
	if err != nil {
		panic(err)
	}
	defer sub.Close()

	pub, err := publish.Open(ctx, "pulsar://broker:6650/public/default/ledger?admin=http://broker:8080", nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close(ctx)
	_, err = pub.Publish(ctx, &keyorder.Message{Key: "acct-42", Payload: []byte(`{"delta":-500}`)})
	if err != nil {
		panic(err)
	}

	err = sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
		return nil // apply d.Payload to account d.Key
	})
	if err != nil {
		panic(err)
	}
}
