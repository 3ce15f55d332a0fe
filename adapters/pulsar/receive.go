package pulsar

import (
	"context"
	"fmt"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/keyorder/keyorder/driver"
)

// Receive waits for at least one message or ctx, and returns at most
// maxMessages of those the client has prefetched, in arrival order (a key's
// messages arrive in key order). With the run record, a message that was
// running when a consumer went away is handed out alone (see handOut).
func (s *subscriptionDriver) Receive(ctx context.Context, maxMessages int) ([]*driver.Message, error) {
	if maxMessages <= 0 || maxMessages > s.opts.MaxBatch {
		maxMessages = s.opts.MaxBatch
	}
	for {
		g, err := s.current()
		if err != nil {
			return nil, err
		}
		var gate <-chan struct{}
		if s.runs != nil {
			var out []*driver.Message
			if out, gate = s.handOut(g, maxMessages); len(out) > 0 {
				return out, nil
			}
		}
		if gate != nil {
			// A charged message waits for the others in flight, or
			// runs: nothing more is handed out until a settlement.
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-g.expired:
			case <-gate:
			}
			continue
		}
		ch := g.consumer.Chan()
		var first pulsar.ConsumerMessage
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-g.expired:
			continue
		case first = <-ch:
		}
		out := []*driver.Message{s.track(g, first.Message)}
	more:
		for len(out) < maxMessages {
			select {
			case cm := <-ch:
				out = append(out, s.track(g, cm.Message))
			default:
				break more
			}
		}
		if s.runs == nil {
			return out, nil
		}
		s.readRecords(ctx, out)
		s.mu.Lock()
		for _, m := range out {
			m.AckID.(*delivery).held = true
		}
		s.held = append(s.held, out...)
		s.mu.Unlock()
	}
}

// handOut takes up to max of the held messages of generation g, in
// arrival order, and stops before a charged one: a message whose run
// record says it was running when a consumer went away (it may be what
// killed that consumer's process). A charged message is handed out alone,
// once nothing else received here is in flight, and nothing is handed out
// after it until it is settled: if it kills this process too, no other
// message is charged a run for it, so a message that kills every process
// it runs in cannot use up the attempts of the messages beside it. When
// nothing can be handed out for that reason, gate is closed at the next
// settlement.
func (s *subscriptionDriver) handOut(g *generation, max int) (out []*driver.Message, gate <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A given-up consumer's messages come back through the broker.
	held := s.held[:0]
	for _, m := range s.held {
		if d := m.AckID.(*delivery); d.gen == g {
			if _, ok := s.tracked[d]; ok {
				held = append(held, m)
			}
		}
	}
	clear(s.held[len(held):])
	s.held = held
	if len(held) == 0 {
		return nil, nil
	}
	if a := s.alone; a != nil {
		if _, ok := s.tracked[a]; ok {
			return nil, s.gateLocked()
		}
		s.alone = nil
	}
	now := time.Now()
	take := func(d *delivery) {
		d.held = false
		d.mu.Lock()
		d.deadline = now.Add(s.opts.Lease) // the lease starts now
		d.mu.Unlock()
	}
	n := 0
	for n < len(held) && len(out) < max {
		m := held[n]
		d := m.AckID.(*delivery)
		if d.charged {
			if len(out) > 0 || len(s.tracked) > len(held) {
				break // others in flight
			}
			take(d)
			out = append(out, m)
			s.alone = d
			n++
			break
		}
		take(d)
		out = append(out, m)
		n++
	}
	clear(held[:n])
	s.held = held[n:]
	if len(s.held) == 0 {
		s.held = nil
	}
	if len(out) == 0 {
		return nil, s.gateLocked()
	}
	return out, nil
}

// gateLocked returns the channel closed at the next settlement (s.mu
// held).
func (s *subscriptionDriver) gateLocked() <-chan struct{} {
	if s.waiter == nil {
		s.waiter = make(chan struct{})
	}
	return s.waiter
}

func (s *subscriptionDriver) track(g *generation, pm pulsar.Message) *driver.Message {
	m := fromMessage(pm)
	d := &delivery{id: pm.ID(), gen: g, key: m.Key, deadline: time.Now().Add(s.opts.Lease)}
	m.AckID = d
	m.Attempt = int(pm.RedeliveryCount()) + 1
	m.Copy = copyOf(pm.ID()) // a redrive publishes a new message
	s.mu.Lock()
	s.seq++
	d.seq = s.seq
	s.tracked[d] = struct{}{}
	if g.seen != nil {
		d.pos, d.topic = idString(pm.ID()), pm.Topic()
		d.suspect = s.suspect(g, d, pm)
		if d.key != "" {
			g.perKey[d.key]++
		}
	}
	s.mu.Unlock()
	return m
}

// suspect reports whether the message may have been running in a consumer
// that went away (called with s.mu held): a receipt covered it before this
// consumer subscribed, or it comes after a later position of its topic (a
// redelivery). Any such message may be: a consumer that dies may have run
// a key's earlier messages to completion without its acknowledgements
// reaching the broker, so not only a key's first message comes back
// having run. A suspect start is recorded before it runs (runs.go).
func (s *subscriptionDriver) suspect(g *generation, d *delivery, pm pulsar.Message) bool {
	topic := pm.Topic()
	seen, hadSeen := g.seen[topic]
	if !hadSeen || notBefore(pm.ID(), seen) {
		g.seen[topic] = pm.ID()
	}
	if high, ok := g.high[topic]; ok && notBefore(high, pm.ID()) {
		return true
	}
	if d.key != "" {
		// A key this consumer holds nothing of, whose message another
		// consumer's receipt covers now: the key may have come from a
		// consumer that went away since this one subscribed. Its
		// messages up to that receipt are suspect.
		if g.perKey[d.key] == 0 {
			delete(g.takeover, d.key)
			if other, ok := s.runs.otherHigh(topic); ok && notBefore(other, pm.ID()) {
				g.takeover[d.key] = other
			}
		}
		if t, ok := g.takeover[d.key]; ok && notBefore(t, pm.ID()) {
			return true
		}
	}
	return hadSeen && !notBefore(pm.ID(), seen)
}

// readRecords sets the attempts and retry times the run record keeps for
// ms. When one of them is suspect it first reads the record topic to its
// end: its record may have been written by a consumer that went away a
// moment ago.
func (s *subscriptionDriver) readRecords(ctx context.Context, ms []*driver.Message) {
	ds := make([]*delivery, len(ms))
	topics := make([]string, len(ms))
	for i, m := range ms {
		ds[i] = m.AckID.(*delivery)
		topics[i] = ds[i].topic
	}
	r := s.runs.received(ds, topics)
	for _, d := range ds {
		d.receipt = r
	}
	for _, m := range ms {
		if m.AckID.(*delivery).suspect {
			if err := s.runs.sync(ctx); err != nil && ctx.Err() == nil {
				s.opts.Logger.Warn("keyorder: pulsar: reading the run records to their end failed; using what was read",
					"topic", s.runs.topic, "err", err)
			}
			break
		}
	}
	for _, m := range ms {
		d := m.AckID.(*delivery)
		r, ok := s.runs.lookup(d.pos)
		d.mu.Lock()
		if ok {
			d.hadRecord = true
			d.charged = r.runs > 0 && !r.returned
			m.Attempt = max(m.Attempt, r.runs+1)
			if r.notBefore.After(m.NotBefore) {
				m.NotBefore = r.notBefore
			}
		}
		d.base = m.Attempt - 1
		d.mu.Unlock()
	}
}

// fromMessage converts a Pulsar message: its key becomes Key, the reserved
// properties ID and NotBefore, the rest Headers.
func fromMessage(pm pulsar.Message) *driver.Message {
	m := &driver.Message{Key: pm.Key(), Payload: pm.Payload(), PublishTime: pm.PublishTime()}
	if k := pm.OrderingKey(); k != "" {
		m.Key = k
	}
	for k, v := range pm.Properties() {
		switch k {
		case PropID:
			m.ID = v
			continue
		case PropNotBefore:
			if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
				m.NotBefore = t
			}
			continue
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string, len(pm.Properties()))
		}
		m.Headers[k] = v
	}
	if m.ID == "" {
		m.ID = idString(pm.ID())
	}
	return m
}

// position is a message's place in its topic (a batch member included),
// the same on each of its redeliveries: it is the driver's
// driver.Message.Copy.
type position struct {
	ledger, entry    int64
	partition, batch int32
}

func copyOf(id pulsar.MessageID) position {
	return position{id.LedgerID(), id.EntryID(), id.PartitionIdx(), id.BatchIdx()}
}

// idString names a message (a batch member included) when it carries no
// keyorder ID.
func idString(id pulsar.MessageID) string {
	return fmt.Sprintf("%d:%d:%d:%d", id.LedgerID(), id.EntryID(), id.PartitionIdx(), id.BatchIdx())
}
