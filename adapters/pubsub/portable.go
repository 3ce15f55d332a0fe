package pubsub

// This file: the typed constructors. They return the portable types over
// the unexported drivers, as gocloud's gcppubsub.OpenTopic returns a
// *pubsub.Topic, so an application never calls a driver method and skips
// the portable layer.

import (
	"context"

	gpubsub "cloud.google.com/go/pubsub/v2"

	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/driverkit"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// OpenTopic returns a Publisher on topicID (an ID in the client's project
// or a full projects/p/topics/t name). The topic must exist (see
// CreateTopic); the client stays the caller's. cfg configures the Publisher
// (nil: defaults).
func OpenTopic(ctx context.Context, client *gpubsub.Client, topicID string, opts *TopicOptions, cfg *publish.Config) (*publish.Publisher, error) {
	return driverkit.Portable(publish.New, cfg)(openTopic(ctx, client, topicID, opts))
}

// OpenSubscription returns a Subscriber of the existing subscription subID
// (see CreateSubscription); the client stays the caller's. cfg configures
// the Subscriber (nil: defaults).
func OpenSubscription(ctx context.Context, client *gpubsub.Client, subID string, opts *SubscriptionOptions, cfg *subscribe.Config) (*subscribe.Subscriber, error) {
	return driverkit.Portable(subscribe.New, cfg)(portable(openSubscription(ctx, client, subID, opts)))
}

// portable passes on openSubscription's driver as the portable layer
// takes it: with driver.StartRecorder when it has a start store.
func portable(s *subscriptionDriver, err error) (driver.Subscription, error) {
	if err != nil {
		return nil, err
	}
	return s.portable(), nil
}
