package kafka

import "github.com/keyorder/keyorder/driver"

// The drivers, for this package's tests: they exercise the driver contract
// directly (Receive, Ack, ...), which applications reach only through
// publish and subscribe.

// Topic is the topic driver.
type Topic = topicDriver

// Subscription is the subscription driver.
type Subscription = subscriptionDriver

// OpenTopicDriver opens the topic driver (see OpenTopic).
var OpenTopicDriver = openTopic

// OpenSubscriptionDriver opens the subscription driver (see
// OpenSubscription).
var OpenSubscriptionDriver = openSubscription

// PartitionOf returns the partition of a received message.
func PartitionOf(m *driver.Message) int32 { return m.Copy.(position).partition }

// Joined reports whether s has a group member (a group client).
func Joined(s *Subscription) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen != nil
}
