package pulsar

import (
	"context"
	"time"

	"github.com/keyorder/keyorder/driver"
)

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

// RunRecord reads the run record topic to its end and returns the runs it
// keeps for m, and whether it keeps any.
func (s *subscriptionDriver) RunRecord(ctx context.Context, m *driver.Message) (int, bool, error) {
	if err := s.runs.sync(ctx); err != nil {
		return 0, false, err
	}
	r, ok := s.runs.lookup(m.AckID.(*delivery).pos)
	return r.runs, ok, nil
}

// SetRunRecordDelay sets how long a handler runs before its start is
// recorded, until the test ends.
func SetRunRecordDelay(t interface{ Cleanup(func()) }, d time.Duration) {
	old := runRecordDelay
	runRecordDelay = d
	t.Cleanup(func() { runRecordDelay = old })
}
