package memory

// This file: the typed constructors, which return the portable types.
//
// The drivers themselves are unexported: an application reaches for
// OpenTopic and OpenSubscription. The tests of the portable layer, the
// conformance suite and keyordertest reach the drivers and the fault hooks
// through an internal package (internal/memhook).

import (
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/driverkit"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// OpenTopic returns a Publisher on topic name, creating the topic if
// needed. cfg configures the Publisher (nil: defaults).
func (b *Broker) OpenTopic(name string, cfg *publish.Config) (*publish.Publisher, error) {
	return driverkit.Portable(publish.New, cfg)(b.newTopicDriver(name), nil)
}

// OpenSubscription returns a Subscriber of the existing subscription name
// (see CreateSubscription); each call is a separate consumer, as separate
// processes would be. cfg configures the Subscriber (nil: defaults).
func (b *Broker) OpenSubscription(name string, cfg *subscribe.Config) (*subscribe.Subscriber, error) {
	drv, err := b.newSubscriptionDriver(name)
	if err != nil {
		return nil, driver.WrapError("open", err, errorCode)
	}
	return driverkit.Portable(subscribe.New, cfg)(drv, nil)
}
