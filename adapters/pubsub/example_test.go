package pubsub_test

import (
	"context"

	"github.com/keyorder/keyorder"
	_ "github.com/keyorder/keyorder/adapters/pubsub" // registers pubsub://
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// The same program on Google Cloud Pub/Sub, chosen by URL: the ordering key
// travels as the Pub/Sub ordering key. Compile-only: it needs the service,
// or its emulator (set PUBSUB_EMULATOR_HOST). Credentials come from the
// environment (Application Default Credentials).
func Example() {
	ctx := context.Background()

	// The subscription first: it receives only what is published after it
	// exists. Opening creates a missing topic
	// and subscription (with message ordering and a dead-letter topic).
	sub, err := subscribe.Open(ctx,
		"pubsub://my-project/ledger?subscription=apply-balance&ordering=ordered&lease=60s",
		&subscribe.Config{Workers: 8})
	if err != nil {
		panic(err)
	}
	defer sub.Close(context.Background())

	pub, err := publish.Open(ctx, "pubsub://my-project/ledger", nil)
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
