package sqs

// This file: the typed constructors. They return the portable types over
// the unexported drivers, as gocloud's gcppubsub.OpenTopic returns a
// *pubsub.Topic, so an application never calls a driver method and skips
// the portable layer.

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/driverkit"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// OpenTopic returns a Publisher on the FIFO queue at queueURL. The queue
// must exist (see CreateQueue); the client stays the caller's. cfg
// configures the Publisher (nil: defaults).
func OpenTopic(ctx context.Context, client *sqs.Client, queueURL string, opts *Options, cfg *publish.Config) (*publish.Publisher, error) {
	return driverkit.Portable(publish.New, cfg)(openTopic(ctx, client, queueURL, opts))
}

// OpenSubscription returns a Subscriber of the FIFO queue at queueURL: one
// consumer of the queue. opts.Lease is the lease and opts.WaitTime the
// long-poll wait; the client stays the caller's. cfg configures the
// Subscriber (nil: defaults).
func OpenSubscription(ctx context.Context, client *sqs.Client, queueURL string, opts *Options, cfg *subscribe.Config) (*subscribe.Subscriber, error) {
	return driverkit.Portable(subscribe.New, cfg)(portable(openSubscription(ctx, client, queueURL, opts)))
}

// portable passes on openSubscription's driver as the portable layer
// takes it: with driver.StartRecorder when it has a start store.
func portable(s *subscriptionDriver, err error) (driver.Subscription, error) {
	if err != nil {
		return nil, err
	}
	return s.portable(), nil
}
