package kafka

// This file: the typed constructors. They return the portable types over
// the unexported drivers, as gocloud's OpenTopic functions return a
// *pubsub.Topic, so an application never calls a driver method and skips
// the portable layer.

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/internal/driverkit"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// OpenTopic returns a Publisher on topic over client, a producing client
// (franz-go's producer is idempotent by default; keep it so). Give the
// client kgo.ProducerLinger(0): the publisher batches per key already, and
// franz-go's default 10ms linger adds 10ms to each key's round trip (on
// the benchmark, 200 keys, PublishBatch: 166k msgs/s without linger). The
// client stays the caller's. cfg configures the Publisher (nil: defaults).
func OpenTopic(ctx context.Context, client *kgo.Client, topic string, opts *TopicOptions, cfg *publish.Config) (*publish.Publisher, error) {
	return driverkit.Portable(publish.New, cfg)(openTopic(ctx, client, topic, opts))
}

// OpenSubscription returns a Subscriber that joins consumer group on topic
// (which must exist) when it first receives, not at open (see the package
// documentation). The group must make a legal dead-letter topic name,
// <topic>.<group>.dead (letters, digits, '.', '_', '-'; at most 249
// characters in all), or OpenSubscription fails with
// keyorder.ErrInvalidConfig. The driver makes its own clients from
// opts.ClientOptions (seed brokers and connection options): a member that
// is given up after a lost lease rejoins with a new client. cfg configures
// the Subscriber (nil: defaults).
func OpenSubscription(ctx context.Context, topic, group string, opts *SubscriptionOptions, cfg *subscribe.Config) (*subscribe.Subscriber, error) {
	if topic != "" && group != "" && !validTopic(DeadLetterTopic(topic, group)) {
		return nil, fmt.Errorf("%w: kafka.OpenSubscription: group %q on topic %q: %s", keyorder.ErrInvalidConfig, group, topic, deadTopicRule)
	}
	return driverkit.Portable(subscribe.New, cfg)(openSubscription(ctx, topic, group, opts))
}
