package pulsar

// This file: the typed constructors. They return the portable types over
// the unexported drivers, as gocloud's gcppubsub.OpenTopic returns a
// *pubsub.Topic, so an application never calls a driver method and skips
// the portable layer.

import (
	"context"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/keyorder/keyorder/internal/driverkit"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// OpenTopic returns a Publisher on topic (a full name, or a short one in
// public/default): one producer. The client stays the caller's. cfg
// configures the Publisher (nil: defaults).
func OpenTopic(ctx context.Context, client pulsar.Client, topic string, opts *TopicOptions, cfg *publish.Config) (*publish.Publisher, error) {
	return driverkit.Portable(publish.New, cfg)(openTopic(ctx, client, topic, opts))
}

// OpenSubscription returns a Subscriber of subscription sub of topic
// (created if missing, Key_Shared): one consumer. The client stays the
// caller's. cfg configures the Subscriber (nil: defaults).
func OpenSubscription(ctx context.Context, client pulsar.Client, topic, sub string, opts *SubscriptionOptions, cfg *subscribe.Config) (*subscribe.Subscriber, error) {
	return driverkit.Portable(subscribe.New, cfg)(openSubscription(ctx, client, topic, sub, opts))
}
