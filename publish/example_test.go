package publish_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory" // registers mem://
	"github.com/keyorder/keyorder/keyordertest"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// Publish resolves each message's ordering key, first that is set wins: the
// message's Key, then its partition-key header, then the publisher's
// Config.Key. Here all three routes reach the same key, so the subscriber
// handles the messages in the order they were published. The key travels
// as the broker's ordering construct and comes back as Delivery.Key and in
// the partition-key header.
func ExamplePublisher_Publish() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	// Subscribe first: a subscription receives only what is published after it exists.
	sub, err := subscribe.Open(ctx, "mem://example.publish?subscription=publish-demo&ordering=ordered", nil)
	if err != nil {
		panic(err)
	}
	defer sub.Close(context.Background())

	pub, err := publish.Open(ctx, "mem://example.publish", &publish.Config{Key: "acct-42"})
	if err != nil {
		panic(err)
	}
	defer pub.Close(context.Background())
	msgs := []*keyorder.Message{
		{Key: "acct-42", Payload: []byte("101 (Key)")},
		{Headers: map[string]string{keyorder.HeaderPartitionKey: "acct-42", "origin": "ops"}, Payload: []byte("102 (header)")},
		{Payload: []byte("103 (Config.Key)")},
	}
	for _, m := range msgs {
		if _, err := pub.Publish(ctx, m); err != nil {
			panic(err)
		}
	}

	var handled atomic.Int32
	err = sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
		fmt.Printf("%s: key %s, headers %v\n", d.Payload, d.Key, d.Headers)
		if handled.Add(1) == int32(len(msgs)) {
			stop()
		}
		return nil
	})
	if err != nil {
		panic(err)
	}
	// Output:
	// 101 (Key): key acct-42, headers map[]
	// 102 (header): key acct-42, headers map[origin:ops]
	// 103 (Config.Key): key acct-42, headers map[]
}

// A keyed publish that fails pauses its key: later publishes of that key
// fail fast with ErrKeyPaused and send nothing, so nothing can overtake the
// failed message; other keys go on. Once the application has dealt with the
// failed message (here: publishes it again), it resumes the key.
func ExamplePublisher_Resume() {
	ctx := context.Background()
	pub, err := publish.Open(ctx, "mem://example.paused", nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close(ctx)

	// Simulate a broker that refuses the next send.
	stop := keyordertest.FailPublishes(memory.DefaultBroker(), "example.paused", keyordertest.PublishFault{Times: 1})
	defer stop()

	_, err = pub.Publish(ctx, &keyorder.Message{Key: "acct-42", Payload: []byte("101")})
	fmt.Println("101 failed:", keyorder.Code(err))

	_, err = pub.Publish(ctx, &keyorder.Message{Key: "acct-42", Payload: []byte("102")})
	fmt.Println("102 paused:", errors.Is(err, keyorder.ErrKeyPaused))
	_, err = pub.Publish(ctx, &keyorder.Message{Key: "acct-7", Payload: []byte("201")})
	fmt.Println("201:", err)
	fmt.Println("paused keys:", pub.Paused())

	fmt.Println("resumed:", pub.Resume("acct-42"))
	for _, p := range []string{"101", "102"} { // in order: 101 first
		_, err = pub.Publish(ctx, &keyorder.Message{Key: "acct-42", Payload: []byte(p)})
		fmt.Println(p+":", err)
	}
	fmt.Println("paused keys:", pub.Paused())
	// Output:
	// 101 failed: Unknown
	// 102 paused: true
	// 201: <nil>
	// paused keys: [acct-42]
	// resumed: true
	// 101: <nil>
	// 102: <nil>
	// paused keys: []
}
