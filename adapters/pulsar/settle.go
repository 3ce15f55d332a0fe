package pulsar

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

func deliveryOf(m *driver.Message) (*delivery, error) {
	d, ok := m.AckID.(*delivery)
	if !ok || d == nil {
		return nil, fmt.Errorf("pulsar: message %q was not received by this driver", m.ID)
	}
	return d, nil
}

// untrack forgets d: settled, or given back.
func (s *subscriptionDriver) untrack(d *delivery) {
	s.mu.Lock()
	s.forgetLocked(d)
	s.mu.Unlock()
}

// forgetLocked forgets d (s.mu held): no lease, no run record written
// after this.
func (s *subscriptionDriver) forgetLocked(d *delivery) {
	if _, ok := s.tracked[d]; !ok {
		return
	}
	delete(s.tracked, d)
	if s.waiter != nil {
		close(s.waiter)
		s.waiter = nil
	}
	if g := d.gen; g.perKey != nil && d.key != "" {
		if g.perKey[d.key]--; g.perKey[d.key] <= 0 {
			delete(g.perKey, d.key)
			delete(g.takeover, d.key)
		}
	}
	d.mu.Lock()
	d.settled = true
	d.mu.Unlock()
}

// Ack acknowledges ms (batch members individually: batch index
// acknowledgment is on). A message whose consumer was given up fails with
// a lost-consumer error: the broker redelivers it.
func (s *subscriptionDriver) Ack(ctx context.Context, ms []*driver.Message) error {
	ds := make([]*delivery, len(ms))
	var first error
	s.mu.Lock()
	for i, m := range ms {
		d, err := deliveryOf(m)
		if err != nil {
			if first == nil {
				first = err
			}
			continue
		}
		s.forgetLocked(d)
		ds[i] = d
	}
	s.mu.Unlock()
	for i, d := range ds {
		if d == nil {
			continue
		}
		var err error
		if d.lost() {
			err = errLostConsumer
		} else {
			err = d.gen.consumer.AckID(d.id)
		}
		if err != nil && first == nil {
			first = fmt.Errorf("pulsar: ack %q: %w", ms[i].ID, err)
		}
		if err == nil && s.runs != nil {
			s.runs.done(d)
		}
	}
	return first
}

// Nack negatively acknowledges m: the broker redelivers it after the
// driver's short nack delay, counting the attempt, but AFTER its key's
// later messages. The subscribe package never calls it (no native hold).
func (s *subscriptionDriver) Nack(ctx context.Context, m *driver.Message, delay time.Duration) error {
	d, err := deliveryOf(m)
	if err != nil {
		return err
	}
	s.untrack(d)
	if d.lost() {
		return errLostConsumer
	}
	d.gen.consumer.NackID(d.id)
	return nil
}

// Release forgets ms without settling them. They stay with this consumer,
// unacknowledged, until it closes (at shutdown, right after): then the
// broker redelivers them in position order, before their keys' later
// messages, without counting an attempt. A nack would count one and replay
// them out of order.
func (s *subscriptionDriver) Release(ctx context.Context, ms []*driver.Message) error {
	for _, m := range ms {
		d, err := deliveryOf(m)
		if err != nil {
			return err
		}
		s.untrack(d)
	}
	return nil
}

// ExtendLeases renews the leases of ms and returns those whose consumer
// the watchdog already gave up (the broker redelivers them).
func (s *subscriptionDriver) ExtendLeases(ctx context.Context, ms []*driver.Message) ([]*driver.Message, error) {
	now := time.Now()
	var lost []*driver.Message
	for _, m := range ms {
		d, err := deliveryOf(m)
		if err != nil {
			return lost, err
		}
		if d.lost() {
			lost = append(lost, m)
			continue
		}
		d.mu.Lock()
		d.deadline = now.Add(s.opts.Lease)
		d.mu.Unlock()
	}
	return lost, nil
}

// watchdog gives up the consumer when a lease ran out: it stops Receive
// taking from it, nacks the expired messages that may have been running
// (so the broker counts the attempt; a disconnect alone does not), then
// closes it (so the broker moves its keys and redelivers its
// unacknowledged messages). Under Ordered only a key's first unsettled
// message may have been running: the later ones come back uncounted
// (driver.Message.Attempt).
func (s *subscriptionDriver) watchdog() {
	defer s.wg.Done()
	t := time.NewTicker(max(s.opts.Lease/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		s.mu.Lock()
		g := s.gen
		var expired []*delivery
		for d := range s.tracked {
			d.mu.Lock()
			if d.gen == g && !d.held && now.After(d.deadline) {
				expired = append(expired, d)
			}
			d.mu.Unlock()
		}
		if len(expired) == 0 || g == nil {
			s.mu.Unlock()
			continue
		}
		n := len(expired)
		if s.opts.Ordering == policy.Ordered {
			first := map[string]uint64{} // each key's first unsettled delivery
			for d := range s.tracked {
				if d.gen == g && d.key != "" && (first[d.key] == 0 || d.seq < first[d.key]) {
					first[d.key] = d.seq
				}
			}
			expired = slices.DeleteFunc(expired, func(d *delivery) bool { return d.key != "" && d.seq != first[d.key] })
		}
		s.gen = nil
		for d := range s.tracked {
			if d.gen == g {
				s.forgetLocked(d)
			}
		}
		s.mu.Unlock()
		g.once.Do(func() { close(g.expired) })
		s.opts.Logger.Warn("keyorder: pulsar: a lease ran out; giving up the consumer so the broker moves its keys",
			"topic", s.topic, "subscription", s.name, "expired", n, "nacked", len(expired))
		for _, d := range expired {
			g.consumer.NackID(d.id)
		}
		// Let the nack tracker send its redelivery request (it ticks at a
		// third of the nack delay), then disconnect.
		select {
		case <-s.stop:
		case <-time.After(3 * nackDelay):
		}
		g.consumer.Close()
	}
}
