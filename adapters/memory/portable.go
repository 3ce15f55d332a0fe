package memory

// This file: the typed constructors, which return the portable types.
//
// Unlike the broker adapters, memory keeps its driver types exported and
// reachable (Broker.TopicDriver, Broker.SubscriptionDriver): it is the
// reference driver and the test double of the portable layer itself. The
// tests of publish, subscribe and keyordertest wrap its drivers to inject
// faults (a gated SendBatch, failing settlements) and crash consumers
// (Subscription.Crash), and the conformance suite takes it through a
// harness; those live outside this package, so an export_test.go could not
// serve them. The method names say "Driver" so that an application reaches
// for OpenTopic and OpenSubscription.

import (
	"errors"

	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// OpenTopic returns a Publisher on topic name, creating the topic if
// needed. cfg configures the Publisher (nil: defaults).
func (b *Broker) OpenTopic(name string, cfg *publish.Config) (*publish.Publisher, error) {
	return publish.New(b.TopicDriver(name), cfg)
}

// OpenSubscription returns a Subscriber of the existing subscription name
// (see CreateSubscription); each call is a separate consumer, as separate
// processes would be. cfg configures the Subscriber (nil: defaults).
func (b *Broker) OpenSubscription(name string, cfg *subscribe.Config) (*subscribe.Subscriber, error) {
	drv, err := b.SubscriptionDriver(name)
	if err != nil {
		return nil, driver.WrapError("open", err, errorCode)
	}
	s, err := subscribe.New(drv, cfg)
	if err != nil {
		return nil, errors.Join(err, drv.Close())
	}
	return s, nil
}
