package pulsar

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/driverkit"
	"github.com/keyorder/keyorder/policy"
)

// SubscriptionOptions configure a subscription driver, and the subscription
// when its first consumer creates it. A nil *SubscriptionOptions means
// defaults.
type SubscriptionOptions struct {
	// Ordering is the keyorder policy: Exclusive and Ordered consume a
	// Key_Shared subscription, Parallel a Shared one. Defaults to
	// policy.Ordered (the zero value), as in URLs.
	Ordering policy.Ordering
	// StickyHashRanges, when set, makes the Key_Shared consumer sticky to
	// these hash ranges (pairs of inclusive start and end in [0, 65535])
	// instead of the broker's auto-split.
	StickyHashRanges []int
	// ReceiverQueueSize is the client's prefetch. Defaults to
	// ReceiverQueueDefault.
	ReceiverQueueSize int
	// Lease is how long a received message stays leased without
	// ExtendLeases before the driver deems the consumer stuck (see the
	// package documentation). Defaults to LeaseDefault.
	Lease time.Duration
	// MaxBatch is the most messages one Receive returns. Defaults to
	// MaxBatchDefault.
	MaxBatch int
	// AdminURL is the broker's admin service (http://host:8080). When set,
	// opening checks the keyorder policy recorded on an existing
	// subscription even when no consumer is attached.
	AdminURL string
	// Name is the consumer name (optional).
	Name string
	// Logger receives the driver's warnings. Defaults to slog.Default().
	Logger *slog.Logger
	// NoRunRecord turns the run record off (see the package
	// documentation, "Runs"): a consumer that dies then counts no attempt.
	NoRunRecord bool
}

func (o *SubscriptionOptions) withDefaults() SubscriptionOptions {
	var out SubscriptionOptions
	if o != nil {
		out = *o
	}
	if out.ReceiverQueueSize <= 0 {
		out.ReceiverQueueSize = ReceiverQueueDefault
	}
	if out.Lease <= 0 {
		out.Lease = LeaseDefault
	}
	if out.MaxBatch <= 0 {
		out.MaxBatch = MaxBatchDefault
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

// nackDelay is the redelivery delay of the watchdog's negative
// acknowledgements; the driver never nacks otherwise.
const nackDelay = 20 * time.Millisecond

// generation is one Pulsar consumer of the driver; a stuck one is closed
// and replaced.
type generation struct {
	consumer pulsar.Consumer
	expired  chan struct{} // closed when the watchdog gives it up
	once     sync.Once
	// With the run record (guarded by the driver's mu): the last message
	// of each (partition) topic when the consumer subscribed and the
	// latest position received of each, to tell which deliveries are
	// suspect.
	high map[string]msgPos
	seen map[string]pulsar.MessageID
	// perKey counts the deliveries of each key tracked; takeover holds,
	// for a key whose first tracked delivery another consumer's receipt
	// covered, that receipt's position (see suspect).
	perKey   map[string]int
	takeover map[string]msgPos
}

// delivery is a received message's AckID.
type delivery struct {
	id  pulsar.MessageID
	gen *generation
	// key and seq (receive order) tell the watchdog which of a key's
	// unsettled messages may have been running.
	key string
	seq uint64
	// pos names the message's place in its topic (its run record's key);
	// topic is the (partition) topic it came from.
	pos, topic string
	mu         sync.Mutex
	// deadline is when the lease runs out unless extended.
	deadline time.Time
	// The run record (runs.go): base is the attempts used before this
	// delivery, runs the handler starts since, recorded the runs last
	// written; suspect: the message may have been running in a consumer
	// that went away, so its starts are recorded before they run.
	base, runs, recorded int
	startedAt            time.Time
	receipt              *receipt // the receipt its start waits for
	suspect, hadRecord   bool
	settled              bool
	// charged: its record says it was running when a consumer went away;
	// it is handed out alone (see handOut). held (guarded by the
	// driver's mu): received, not handed out yet.
	charged, held bool
}

func (d *delivery) lost() bool {
	select {
	case <-d.gen.expired:
		return true
	default:
		return false
	}
}

// subscriptionDriver is the driver.Subscription driver of one consumer of a
// Pulsar subscription (see the package documentation for leases).
type subscriptionDriver struct {
	client    pulsar.Client
	topic     string
	name      string
	deadTopic string
	opts      SubscriptionOptions
	ownClient bool

	mu       sync.Mutex
	closed   bool
	gen      *generation
	tracked  map[*delivery]struct{}
	seq      uint64          // deliveries tracked so far
	deadProd pulsar.Producer // DeadLetter, redrive markers
	topicPrd pulsar.Producer // Redrive
	runs     *runLog         // nil with NoRunRecord
	// With the run record: held are the messages received and not
	// handed out yet, in arrival order; alone is a charged delivery
	// handed out alone; waiter is closed when a tracked delivery is
	// forgotten (settled, given back, lost).
	held   []*driver.Message
	alone  *delivery
	waiter chan struct{}
	stop   chan struct{}
	wg     sync.WaitGroup
}

var (
	_ driver.Subscription    = (*subscriptionDriver)(nil)
	_ driver.DeadLetterStore = (*subscriptionDriver)(nil)
	_ driver.StartRecorder   = (*subscriptionDriver)(nil)
	_ driver.Returner        = (*subscriptionDriver)(nil)
)

// DeadLetterTopic returns the dead-letter topic of subscription sub on
// topic: <topic>-<sub>-dead.
func DeadLetterTopic(topic, sub string) string { return topic + "-" + sub + "-dead" }

// openSubscription subscribes to subscription sub of topic (created if
// missing, with the policy recorded in its properties) and returns its
// consuming driver. An existing subscription of another type fails with
// ErrOrderingMismatch. The client stays the caller's: Close does not close
// it.
func openSubscription(ctx context.Context, client pulsar.Client, topic, sub string, opts *SubscriptionOptions) (*subscriptionDriver, error) {
	return openSubscriptionOwning(ctx, client, topic, sub, opts, false)
}

// openSubscriptionOwning is openSubscription; with own the driver owns
// client: it is closed with the driver, or when opening fails, also after
// ctx ended (when the client's late answer arrives).
func openSubscriptionOwning(ctx context.Context, client pulsar.Client, topic, sub string, opts *SubscriptionOptions, own bool) (*subscriptionDriver, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: pulsar.OpenSubscription: nil client", keyorder.ErrInvalidConfig)
	}
	fail := func(err error) (*subscriptionDriver, error) {
		if own {
			client.Close()
		}
		return nil, err
	}
	if sub == "" {
		return fail(fmt.Errorf("%w: pulsar.OpenSubscription: empty subscription name", keyorder.ErrInvalidConfig))
	}
	o := opts.withDefaults()
	if len(o.StickyHashRanges) > 0 {
		if _, err := pulsar.NewKeySharedPolicySticky(o.StickyHashRanges); err != nil {
			return fail(fmt.Errorf("%w: pulsar: sticky hash ranges: %v", keyorder.ErrInvalidConfig, err))
		}
	}
	if o.AdminURL != "" {
		if err := checkSubscription(ctx, o.AdminURL, topic, sub, o.Ordering); err != nil {
			return fail(err)
		}
	}
	if err := ctx.Err(); err != nil {
		return fail(fmt.Errorf("pulsar: subscribe %s on %s: %w", sub, topic, err))
	}
	s := &subscriptionDriver{
		client: client, topic: topic, name: sub, deadTopic: DeadLetterTopic(topic, sub),
		opts: o, tracked: map[*delivery]struct{}{}, stop: make(chan struct{}), ownClient: own,
	}
	return await(ctx, "subscribe "+sub+" on "+topic, func() (*subscriptionDriver, error) {
		if !o.NoRunRecord {
			l, err := openRunLog(ctx, s)
			if err != nil {
				s.Close()
				return nil, err
			}
			s.runs = l
		}
		if _, err := s.current(); err != nil {
			s.Close() // closes an owned client
			return nil, err
		}
		s.wg.Add(1)
		go s.watchdog()
		return s, nil
	}, func(s *subscriptionDriver) { s.Close() })
}

func (s *subscriptionDriver) consumerOptions() pulsar.ConsumerOptions {
	zero := int64(0)
	co := pulsar.ConsumerOptions{
		Topic:                          s.topic,
		SubscriptionName:               s.name,
		Name:                           s.opts.Name,
		Type:                           pulsar.Shared,
		SubscriptionInitialPosition:    pulsar.SubscriptionPositionEarliest,
		SubscriptionProperties:         map[string]string{PropOrdering: s.opts.Ordering.String()},
		ReceiverQueueSize:              s.opts.ReceiverQueueSize,
		EnableBatchIndexAcknowledgment: true,
		NackRedeliveryDelay:            nackDelay,
		NackPrecisionBit:               &zero,
	}
	if s.opts.Ordering.Keyed() {
		co.Type = pulsar.KeyShared
		co.KeySharedPolicy = &pulsar.KeySharedPolicy{Mode: pulsar.KeySharedPolicyModeAutoSplit}
		if len(s.opts.StickyHashRanges) > 0 {
			co.KeySharedPolicy = &pulsar.KeySharedPolicy{Mode: pulsar.KeySharedPolicyModeSticky, HashRanges: s.opts.StickyHashRanges}
		}
	}
	return co
}

// current returns the live consumer, subscribing when there is none.
func (s *subscriptionDriver) current() (*generation, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	if s.gen != nil {
		return s.gen, nil
	}
	c, err := s.client.Subscribe(s.consumerOptions())
	if err != nil {
		return nil, fmt.Errorf("pulsar: subscribe %s on %s: %w", s.name, s.topic, mismatch(err))
	}
	g := &generation{consumer: c, expired: make(chan struct{})}
	if s.runs != nil {
		// What the receipts cover was handed to a consumer before this
		// one subscribed: it comes back here because that consumer went
		// away.
		g.high = s.runs.highWater()
		g.seen = map[string]pulsar.MessageID{}
		g.perKey, g.takeover = map[string]int{}, map[string]msgPos{}
	}
	s.gen = g
	return s.gen, nil
}

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

// truncateUTF8 cuts s to at most n bytes on a rune boundary.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// producers returns the dead-letter and topic producers, made on first use.
func (s *subscriptionDriver) producers() (dead, topic pulsar.Producer, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, errClosed
	}
	if s.deadProd == nil {
		d, err := s.client.CreateProducer(pulsar.ProducerOptions{Topic: s.deadTopic, DisableBatching: true})
		if err != nil {
			return nil, nil, fmt.Errorf("pulsar: producer for %s: %w", s.deadTopic, err)
		}
		t, err := s.client.CreateProducer(pulsar.ProducerOptions{Topic: s.topic, DisableBatching: true})
		if err != nil {
			d.Close()
			return nil, nil, fmt.Errorf("pulsar: producer for %s: %w", s.topic, err)
		}
		s.deadProd, s.topicPrd = d, t
	}
	return s.deadProd, s.topicPrd, nil
}

// DeadLetter publishes m to <topic>-<subscription>-dead with its key,
// headers, ID and keyorder-reason, keyorder-attempts and keyorder-dead-at,
// then acknowledges it. If the acknowledgement fails, m may be
// dead-lettered twice.
func (s *subscriptionDriver) DeadLetter(ctx context.Context, m *driver.Message, reason string, attempts int) error {
	if _, err := deliveryOf(m); err != nil {
		return err
	}
	pm, err := toProducerMessage(&driver.Message{ID: m.ID, Key: m.Key, Payload: m.Payload, Headers: m.Headers, NotBefore: m.NotBefore})
	if err != nil {
		return err
	}
	pm.Properties[PropReason] = truncateUTF8(reason, maxReason)
	pm.Properties[PropAttempts] = strconv.Itoa(attempts)
	pm.Properties[PropDeadAt] = time.Now().UTC().Format(time.RFC3339Nano)
	dead, _, err := s.producers()
	if err != nil {
		return err
	}
	if _, err := dead.Send(ctx, pm); err != nil {
		return fmt.Errorf("pulsar: dead-letter to %s: %w", s.deadTopic, err)
	}
	return s.Ack(ctx, []*driver.Message{m})
}

// Capabilities: the subscription's policy, no native hold, the driver's
// lease.
func (s *subscriptionDriver) Capabilities() driver.Capabilities {
	return driver.Capabilities{
		Ordering:      s.opts.Ordering,
		NativeHold:    false,
		LeaseDuration: s.opts.Lease,
		MaxBatch:      s.opts.MaxBatch,
	}
}

// IsRetryable reports whether err is transient.
func (s *subscriptionDriver) IsRetryable(err error) bool { return isRetryable(err) }

// ErrorCode classifies err.
func (s *subscriptionDriver) ErrorCode(err error) keyorder.ErrorCode { return errorCode(err) }

// Close closes the consumer: the broker redelivers its unacknowledged
// messages to the subscription's other consumers, in position order. It
// closes the client if the driver opened it (URL opener).
func (s *subscriptionDriver) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	g := s.gen
	s.gen = nil
	dead, topic := s.deadProd, s.topicPrd
	s.mu.Unlock()
	close(s.stop)
	s.wg.Wait()
	if s.runs != nil {
		s.runs.close()
	}
	if g != nil {
		g.once.Do(func() { close(g.expired) })
		g.consumer.Close()
	}
	if dead != nil {
		dead.Close()
		topic.Close()
	}
	if s.ownClient {
		s.client.Close()
	}
	return nil
}

// readDead reads the whole dead-letter topic: the dead letters not redriven
// since, oldest first, with the message to republish.
func (s *subscriptionDriver) readDead(ctx context.Context) ([]driver.DeadLetter, error) {
	r, err := s.client.CreateReader(pulsar.ReaderOptions{Topic: s.deadTopic, StartMessageID: pulsar.EarliestMessageID()})
	if err != nil {
		return nil, fmt.Errorf("pulsar: reader of %s: %w", s.deadTopic, err)
	}
	defer r.Close()
	var log driverkit.DeadLog
	for r.HasNext() {
		pm, err := r.Next(ctx)
		if err != nil {
			return nil, fmt.Errorf("pulsar: read %s: %w", s.deadTopic, err)
		}
		if id, ok := pm.Properties()[PropRedriven]; ok {
			log.Redriven(id)
			continue
		}
		log.Add(deadLetterOf(pm))
	}
	return log.Letters(), nil
}

func deadLetterOf(pm pulsar.Message) driver.DeadLetter {
	return driverkit.DeadLetterOf(fromMessage(pm))
}

// deadStore is DeadLetters and Redrive over <topic>-<subscription>-dead:
// a redriven message is republished on the topic (with its key, headers
// and ID, after everything published meanwhile) and marked redriven on the
// dead-letter topic. It reaches every subscription of the topic, not only
// this one.
func (s *subscriptionDriver) deadStore() driverkit.LogStore {
	return driverkit.LogStore{
		Read:  s.readDead,
		Ready: func() error { _, _, err := s.producers(); return err },
		Republish: func(ctx context.Context, m *driver.Message) error {
			_, topic, err := s.producers()
			var pm *pulsar.ProducerMessage
			if err == nil {
				pm, err = toProducerMessage(m)
			}
			if err == nil {
				_, err = topic.Send(ctx, pm)
			}
			if err != nil {
				return fmt.Errorf("pulsar: redrive %q to %s: %w", m.ID, s.topic, err)
			}
			return nil
		},
		MarkRedriven: func(ctx context.Context, id string) error {
			dead, _, err := s.producers()
			if err == nil {
				_, err = dead.Send(ctx, &pulsar.ProducerMessage{Properties: map[string]string{PropRedriven: id}})
			}
			if err != nil {
				return fmt.Errorf("pulsar: redrive %q: mark dead letter redriven: %w", id, err)
			}
			return nil
		},
	}
}

// DeadLetters lists up to limit dead letters (all when limit <= 0), oldest
// first, reading <topic>-<subscription>-dead from its start.
func (s *subscriptionDriver) DeadLetters(ctx context.Context, limit int) ([]driver.DeadLetter, error) {
	return s.deadStore().DeadLetters(ctx, limit)
}

// Redrive republishes the dead letters with these IDs on the topic, with
// their key, headers and ID and without their not-before time, after
// everything published meanwhile, and marks each redriven on the
// dead-letter topic. A redriven message reaches every subscription of the
// topic, not only this one.
func (s *subscriptionDriver) Redrive(ctx context.Context, ids []string) (int, error) {
	return s.deadStore().Redrive(ctx, ids)
}

// Name returns the subscription's name (Delivery.Subscription).
func (s *subscriptionDriver) Name() string { return s.name }
