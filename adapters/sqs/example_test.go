package sqs_test

import (
	"context"

	"github.com/keyorder/keyorder"
	_ "github.com/keyorder/keyorder/adapters/sqs" // registers sqs://
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// The same program on Amazon SQS FIFO, chosen by URL: the ordering key
// becomes the MessageGroupId. One FIFO queue is one subscription, so both
// URLs name the same queue. Compile-only: it needs SQS, or an endpoint
// such as ElasticMQ (endpoint=http://127.0.0.1:9324). Credentials come from
// the SDK's default chain (environment, profile, role).
func Example() {
	ctx := context.Background()

	// The subscription first: it receives only what is published after it
	// exists. On SQS the queue is the
	// subscription: opening either URL creates the queue (and
	// ledger-dead.fifo for dead letters) when it is missing.
	sub, err := subscribe.Open(ctx,
		"sqs://ledger.fifo?region=eu-west-1&ordering=ordered&lease=30s",
		&subscribe.Config{Workers: 8})
	if err != nil {
		panic(err)
	}
	defer sub.Close(context.Background())

	pub, err := publish.Open(ctx, "sqs://ledger.fifo?region=eu-west-1&ordering=ordered", nil)
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
