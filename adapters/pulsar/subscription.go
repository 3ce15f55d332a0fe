package pulsar

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
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

// Name returns the subscription's name (Delivery.Subscription).
func (s *subscriptionDriver) Name() string { return s.name }
