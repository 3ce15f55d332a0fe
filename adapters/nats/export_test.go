package nats

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyorder/keyorder/driver"
)

// OpenTopicDriver and OpenSubscriptionDriver expose the drivers to the
// conformance suite.
func OpenTopicDriver(ctx context.Context, js jetstream.JetStream, stream string, opts *TopicOptions) (driver.Topic, error) {
	return openTopic(ctx, js, stream, opts)
}

func OpenSubscriptionDriver(ctx context.Context, js jetstream.JetStream, stream, sub string, opts *SubscriptionOptions) (driver.Subscription, error) {
	return openSubscription(ctx, js, stream, sub, opts)
}
