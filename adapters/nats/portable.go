package nats

// This file: the typed constructors. They return the portable types over
// the unexported drivers, so an application never calls a driver method
// and skips the portable layer.

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyorder/keyorder/internal/driverkit"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// OpenTopic returns a Publisher on the keyorder stream (made with
// EnsureStream) over js, the caller's JetStream context (its connection
// stays the caller's). cfg configures the Publisher (nil: defaults).
func OpenTopic(ctx context.Context, js jetstream.JetStream, stream string, opts *TopicOptions, cfg *publish.Config) (*publish.Publisher, error) {
	return driverkit.Portable(publish.New, cfg)(openTopic(ctx, js, stream, opts))
}

// OpenSubscription returns a Subscriber of subscription sub on the
// keyorder stream over js. It takes its share of the partitions when it
// first receives. cfg configures the Subscriber (nil: defaults).
func OpenSubscription(ctx context.Context, js jetstream.JetStream, stream, sub string, opts *SubscriptionOptions, cfg *subscribe.Config) (*subscribe.Subscriber, error) {
	return driverkit.Portable(subscribe.New, cfg)(openSubscription(ctx, js, stream, sub, opts))
}
