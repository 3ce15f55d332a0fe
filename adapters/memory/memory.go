// Package memory is an in-process broker for keyorder: topics, subscriptions
// with their own ordering policy, leases, retries, dead letters and redrive,
// all in memory. It needs no server, which makes it the backend for examples,
// unit tests and the conformance suite's fake-clock runs.
//
// A subscription plays one of two shapes, chosen at creation (Hold): Native,
// where the broker itself holds an ordering group like a database claim
// query or SQS visibility does; or InProcess, where it streams a key's
// messages in order regardless of what is unsettled and redelivers a key's
// later messages after a lost lease, like Pub/Sub with ordering keys. The
// second shape makes the subscribe package hold groups in process, so both
// paths of the library are exercised without a broker.
//
// # URLs
//
//	mem://ledger                                    a topic
//	mem://ledger?subscription=apply-balance&ordering=ordered
//
// Subscription parameters: subscription (required), ordering (parallel,
// exclusive, ordered; default ordered), hold (native or inprocess; default
// native), lease (a Go duration; default 30s), max_batch (default 10), chain
// (messages of one key per receive, native only; default 1). The
// subscription is created on first open; opening it again with a different
// ordering or hold fails. Topic parameters: max_key, max_payload (bytes),
// payload (required or optional; default optional). The old spellings
// maxbatch, maxkey and maxpayload are still accepted (a deprecation warning
// is logged); giving both spellings is an error.
// Topics and subscriptions opened by URL live in one broker per process,
// owned by the registered opener.
//
// # Ordering
//
// Native: the subscription is a queue of ordering groups: the oldest
// deliverable message goes first; under Exclusive and Ordered nothing of a group is handed out
// while one of its messages is leased; Nack under Ordered holds the group
// until the retry time. InProcess: messages of a key go, in order, to one
// consumer at a time (the one holding unsettled messages of the key).
//
// # Delivery semantics
//
// At least once. A lease that expires makes the message deliverable again
// (InProcess: with every later delivered message of its key, acknowledged
// or not, as Pub/Sub does). It counts an attempt only for a message that
// may have been running, as driver.Message.Attempt defines and
// PostgreSQL counts: under Ordered the first unsettled message of a chain
// (InProcess: of the key's delivered messages), unless a message before it
// in the chain was nacked; under Exclusive the first unsettled one of a
// chain; under Parallel every one. The rest come back as not run.
//
// # Fault injection
//
// Sends and settlement calls can be made to fail on demand, transiently or
// permanently, before or after taking effect, and a consumer can be made to
// die (its leases expire without settlement), so the portable layer's
// retries can be tested without a network: see package keyordertest
// (FailPublishes, FailSettlements, Consumer.Crash).
package memory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/internal/slab"
	"github.com/keyorder/keyorder/policy"
)

// Scheme is the URL scheme the package registers.
const Scheme = "mem"

// Hold is where a subscription's ordering groups are held.
type Hold int

const (
	// Native: the broker holds groups (see driver.Capabilities.NativeHold).
	Native Hold = iota
	// InProcess: the broker streams each key in order and the subscriber
	// holds groups in process.
	InProcess
)

// Defaults for SubscriptionOptions and TopicOptions.
const (
	LeaseDurationDefault = 30 * time.Second
	MaxBatchDefault      = 10
	MaxPayloadDefault    = 1 << 20
	MaxKeyDefault        = 1024
)

// SubscriptionOptions configures a subscription at creation.
type SubscriptionOptions struct {
	// Ordering is the delivery policy. Defaults to policy.Ordered (the zero
	// value), as on every backend and in URLs.
	Ordering policy.Ordering
	// Hold selects the broker's shape. Defaults to Native.
	Hold Hold
	// Lease is how long a delivery stays leased without extension (every
	// backend's typed options call it Lease). Defaults to
	// LeaseDurationDefault.
	Lease time.Duration
	// LeaseDuration is the older name of Lease, read when Lease is not set (Lease
	// wins when both are).
	//
	// Deprecated: use Lease.
	LeaseDuration time.Duration
	// MaxBatch is the most messages one Receive returns. Defaults to
	// MaxBatchDefault.
	MaxBatch int
	// Chain is how many consecutive messages of one key a Native receive may
	// return together. Defaults to 1.
	Chain int
	// Retry, when set, is a retry policy stored with the subscription, as
	// PostgreSQL stores one; subscribers run it (driver.Capabilities.Retry).
	// Defaults to nil: the subscription stores none.
	Retry *policy.Retry
}

func (c *SubscriptionOptions) withDefaults() SubscriptionOptions {
	var out SubscriptionOptions
	if c != nil {
		out = *c
	}
	if out.Lease > 0 {
		out.LeaseDuration = out.Lease // Lease wins over its older name
	}
	if out.LeaseDuration <= 0 {
		out.LeaseDuration = LeaseDurationDefault
	}
	out.Lease = out.LeaseDuration
	if out.MaxBatch <= 0 {
		out.MaxBatch = MaxBatchDefault
	}
	if out.Chain <= 0 {
		out.Chain = 1
	}
	if out.Retry != nil {
		r := *out.Retry
		out.Retry = &r
	}
	return out
}

// Broker is an in-memory broker. It is safe for concurrent use.
type Broker struct {
	mu     sync.Mutex
	topics map[string]*topic
	subs   map[string]*subscription
}

// NewBroker returns an empty broker.
func NewBroker() *Broker {
	return &Broker{topics: map[string]*topic{}, subs: map[string]*subscription{}}
}

type topic struct {
	name   string
	cfg    TopicOptions
	subs   []*subscription
	failFn func([]*driver.Message) error

	// payloads stores the copies SendBatch takes (payloadChunk at a time),
	// guarded by payloadsMu.
	payloadsMu sync.Mutex
	payloads   slab.Bytes
}

// payloadChunk is how many bytes of payload copies one allocation holds,
// for a topic's stored messages and a subscription's deliveries alike.
// Small copies are cut from chunks (most payloads are small, and a
// publisher often hands over one message per call); a chunk lives until
// none of the copies cut from it is referenced (see internal/slab).
const payloadChunk = 4096

// CreateTopic creates a topic; creating an existing one is a no-op.
func (b *Broker) CreateTopic(name string, cfg *TopicOptions) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.topicLocked(name, cfg)
}

func (b *Broker) topicLocked(name string, cfg *TopicOptions) *topic {
	if t, ok := b.topics[name]; ok {
		return t
	}
	c := TopicOptions{}
	if cfg != nil {
		c = *cfg
	}
	if c.MaxKeyBytes == 0 {
		c.MaxKeyBytes = MaxKeyDefault
	}
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = MaxPayloadDefault
	}
	t := &topic{name: name, cfg: c, payloads: slab.NewBytes(payloadChunk)}
	b.topics[name] = t
	return t
}

// CreateSubscription creates a subscription on topic (creating the topic if
// needed). Messages published before the subscription exists are not
// delivered to it. Creating an existing subscription with the same
// configuration is a no-op; with a different ordering or hold it fails.
// An Ordering or Hold out of range fails with keyorder.ErrInvalidConfig.
func (b *Broker) CreateSubscription(topicName, name string, cfg *SubscriptionOptions) error {
	c := cfg.withDefaults()
	switch {
	case !c.Ordering.Valid():
		return fmt.Errorf("%w: memory: SubscriptionOptions.Ordering: unknown ordering %d", keyorder.ErrInvalidConfig, int(c.Ordering))
	case c.Hold != Native && c.Hold != InProcess:
		return fmt.Errorf("%w: memory: SubscriptionOptions.Hold: unknown hold %d", keyorder.ErrInvalidConfig, int(c.Hold))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if s, ok := b.subs[name]; ok {
		if s.topic != topicName || s.cfg.Ordering != c.Ordering || s.cfg.Hold != c.Hold {
			return fmt.Errorf("memory: subscription %q exists on topic %q with ordering %v, hold %d: %w",
				name, s.topic, s.cfg.Ordering, s.cfg.Hold, errConflict)
		}
		return nil
	}
	t := b.topicLocked(topicName, nil)
	s := newSubscription(name, topicName, c)
	b.subs[name] = s
	t.subs = append(t.subs, s)
	return nil
}

var (
	errConflict = errors.New("already exists with another configuration")
	errNoLease  = errors.New("memory: lease not held (expired or settled)")
	errNotFound = errors.New("memory: not found")
)

// failSends makes every SendBatch on topic call fn first; a non-nil result
// fails the batch without delivering anything. nil stops
// (memhook.Broker.FailSends).
func (b *Broker) failSends(topicName string, fn func(ms []*driver.Message) error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.topicLocked(topicName, nil).failFn = fn
}

// failSettlements makes every settlement call of every consumer of the
// subscription call fn first (memhook.Broker.FailSettlements).
func (b *Broker) failSettlements(subName string, fn func(op memhook.Op, ms []*driver.Message) memhook.Fault) error {
	b.mu.Lock()
	s, ok := b.subs[subName]
	b.mu.Unlock()
	if !ok {
		return fmt.Errorf("memory: subscription %q: %w", subName, errNotFound)
	}
	if fn == nil {
		s.faults.Store(nil)
	} else {
		s.faults.Store(&fn)
	}
	return nil
}

// newSubscriptionDriver returns a consuming driver for an existing
// subscription. Each call returns a separate consumer, as separate
// processes would have.
func (b *Broker) newSubscriptionDriver(name string) (*subscriptionDriver, error) {
	b.mu.Lock()
	s, ok := b.subs[name]
	b.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("memory: subscription %q: %w", name, errNotFound)
	}
	return &subscriptionDriver{s: s, consumer: s.newConsumer(), crash: make(chan struct{})}, nil
}

var _ driver.Topic = (*topicDriver)(nil)

func errorCode(err error) keyorder.ErrorCode {
	switch {
	case errors.Is(err, errNotFound):
		return keyorder.CodeNotFound
	case errors.Is(err, errConflict):
		return keyorder.CodeFailedPrecondition
	case errors.Is(err, memhook.ErrTransient):
		return keyorder.CodeUnavailable
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return keyorder.CodeCanceled
	}
	return keyorder.CodeUnknown
}

// subscriptionDriver is the driver.Subscription driver of one consumer of a
// memory subscription.
type subscriptionDriver struct {
	s        *subscription
	consumer int

	crashed   atomic.Bool
	crash     chan struct{} // closed by Crash
	crashOnce sync.Once
}

var (
	_ driver.Subscription    = (*subscriptionDriver)(nil)
	_ driver.DeadLetterStore = (*subscriptionDriver)(nil)
)

// Receive waits for deliverable messages. Each message's Payload is its
// own copy, made for this delivery: the consumer may modify it without
// changing what a redelivery or another subscription receives. Headers are
// shared and must not be modified.
func (d *subscriptionDriver) Receive(ctx context.Context, max int) ([]*driver.Message, error) {
	if d.crashed.Load() {
		return nil, memhook.ErrCrashed
	}
	return d.s.receive(ctx, d.consumer, max, d.crash)
}

// Crash makes this consumer behave as a process that died: from now on
// every call fails with memhook.ErrCrashed without reaching the broker (a Receive
// under way returns it at once), so nothing it holds is acknowledged,
// returned or extended, and its leases expire after the subscription's
// lease duration, counting an attempt for the messages that may have been
// running (see Delivery semantics), as a dead process's would. A
// consumer opened afterwards plays the restarted process
// (memhook.Subscription.Crash).
func (d *subscriptionDriver) Crash() {
	d.crashOnce.Do(func() {
		d.crashed.Store(true)
		close(d.crash)
	})
}

// inject runs a settlement call through the subscription's fault hook.
func (d *subscriptionDriver) inject(op memhook.Op, ms []*driver.Message, call func() error) error {
	if d.crashed.Load() {
		return memhook.ErrCrashed
	}
	fn := d.s.faults.Load()
	if fn == nil {
		return call()
	}
	f := (*fn)(op, ms)
	if f.Err == nil {
		return call()
	}
	if f.Applied {
		call()
	}
	return f.Err
}

// Ack settles messages.
func (d *subscriptionDriver) Ack(ctx context.Context, ms []*driver.Message) error {
	return d.inject(memhook.OpAck, ms, func() error {
		return d.s.settle(ms, func(l *lease, now time.Time) { d.s.ack(l) })
	})
}

// Nack returns a failed message, redeliverable after delay.
func (d *subscriptionDriver) Nack(ctx context.Context, m *driver.Message, delay time.Duration) error {
	ms := []*driver.Message{m}
	return d.inject(memhook.OpNack, ms, func() error {
		return d.s.settle(ms, func(l *lease, now time.Time) {
			l.nacked = true
			d.s.retry(l, now.Add(delay), true, !d.s.ordered())
		})
	})
}

// Release returns unhandled messages without counting an attempt. It returns
// the last first: on an InProcess subscription returning a message returns
// the later delivered messages of its key with it.
func (d *subscriptionDriver) Release(ctx context.Context, ms []*driver.Message) error {
	return d.inject(memhook.OpRelease, ms, func() error {
		return d.s.settleOrder(ms, true, func(l *lease, now time.Time) { d.s.retry(l, time.Time{}, false, false) })
	})
}

// Return gives back messages that ran and wait for a retry
// (driver.Returner): each is delivered again not before its NotBefore,
// its next delivery counted as attempt Attempts+1, holding its key until
// then under Ordered as a Nack does. On an InProcess subscription the
// later delivered messages of its key come back with it, uncounted, as
// with Release; the last is returned first.
func (d *subscriptionDriver) Return(ctx context.Context, rs []driver.Returned) error {
	ms := make([]*driver.Message, len(rs))
	for i, r := range rs {
		ms[i] = r.Message
	}
	return d.inject(memhook.OpReturn, ms, func() error { return d.s.giveBackCounted(rs) })
}

// ExtendLeases renews leases; expired ones are reported lost.
func (d *subscriptionDriver) ExtendLeases(ctx context.Context, ms []*driver.Message) ([]*driver.Message, error) {
	var lost []*driver.Message
	err := d.inject(memhook.OpExtendLeases, ms, func() error {
		lost = d.s.extend(ms)
		return nil
	})
	return lost, err
}

// DeadLetter moves m to the subscription's dead letters.
func (d *subscriptionDriver) DeadLetter(ctx context.Context, m *driver.Message, reason string, attempts int) error {
	ms := []*driver.Message{m}
	return d.inject(memhook.OpDeadLetter, ms, func() error {
		return d.s.settle(ms, func(l *lease, now time.Time) { d.s.deadLetter(l, reason, attempts, now) })
	})
}

// ReleaseRedelivers implements driver.ReleaseRedeliverer: a released
// message is deliverable again at once, before its key's later messages
// not leased.
func (d *subscriptionDriver) ReleaseRedelivers() bool { return true }

// Capabilities describes the subscription.
func (d *subscriptionDriver) Capabilities() driver.Capabilities {
	return driver.Capabilities{
		Ordering:      d.s.cfg.Ordering,
		NativeHold:    d.s.cfg.Hold == Native,
		LeaseDuration: d.s.cfg.Lease,
		MaxBatch:      d.s.cfg.MaxBatch,
		Retry:         d.s.cfg.Retry,
	}
}

// IsRetryable reports whether err is transient.
func (d *subscriptionDriver) IsRetryable(err error) bool { return errors.Is(err, memhook.ErrTransient) }

// ErrorCode classifies memory errors.
func (d *subscriptionDriver) ErrorCode(err error) keyorder.ErrorCode { return errorCode(err) }

// Close detaches the consumer; its leases expire as a crashed process's
// would.
func (d *subscriptionDriver) Close() error { return nil }

// DeadLetters lists dead letters, oldest first.
func (d *subscriptionDriver) DeadLetters(ctx context.Context, limit int) ([]driver.DeadLetter, error) {
	return d.s.deadLetters(limit), nil
}

// Redrive re-enqueues dead letters after everything that arrived meanwhile.
func (d *subscriptionDriver) Redrive(ctx context.Context, ids []string) (int, error) {
	done := d.s.redrive(ids)
	return len(done), driver.NotDeadLetters(ids, done)
}

// Name returns the subscription's name (driver.Namer).
func (d *subscriptionDriver) Name() string { return d.s.name }

func init() {
	memhook.Register(func(b any) (memhook.Broker, bool) {
		br, ok := b.(*Broker)
		return hooks{br}, ok && br != nil
	})
}

// hooks is the test surface of a Broker (memhook.Broker), which package
// keyordertest and the tests of the portable layer reach.
type hooks struct{ b *Broker }

func (h hooks) TopicDriver(name string) driver.Topic { return h.b.newTopicDriver(name) }

func (h hooks) SubscriptionDriver(name string) (memhook.Subscription, error) {
	d, err := h.b.newSubscriptionDriver(name)
	if err != nil {
		return nil, err
	}
	return d, nil
}

func (h hooks) FailSends(topic string, fn func(ms []*driver.Message) error) {
	h.b.failSends(topic, fn)
}

func (h hooks) FailSettlements(sub string, fn func(op memhook.Op, ms []*driver.Message) memhook.Fault) error {
	return h.b.failSettlements(sub, fn)
}
