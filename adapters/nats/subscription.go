package nats

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// Defaults of SubscriptionOptions.
const (
	// LeaseDefault is the default lease (the consumers' AckWait).
	LeaseDefault = 30 * time.Second
	// MaxBatchDefault is the most messages one Receive returns.
	MaxBatchDefault = 500
	// MaxPendingDefault is the most unacknowledged messages per partition
	// (the consumers' MaxAckPending).
	MaxPendingDefault = 1000
	// RevokeTimeoutDefault bounds how long releasing a partition waits
	// for its messages in flight.
	RevokeTimeoutDefault = 20 * time.Second
	// watchdogEvery is how often the driver looks for a lease that ran
	// out unrenewed.
	watchdogEvery = 250 * time.Millisecond
	// fetchWait is how long one pull request waits for messages.
	fetchWait = 250 * time.Millisecond
)

// SubscriptionOptions configure a subscription driver. A nil
// *SubscriptionOptions means defaults.
type SubscriptionOptions struct {
	// Ordering is the keyorder policy, enforced in process. Defaults to
	// policy.Ordered (the zero value), as in URLs.
	Ordering policy.Ordering
	// Lease is the consumers' AckWait, kept alive with InProgress while a
	// message is held or handled, and sets the partition ownership's TTL
	// (one and a half leases) and renewal (every quarter lease). Defaults
	// to LeaseDefault; at least one second.
	Lease time.Duration
	// MaxBatch is the most messages one Receive returns. Defaults to
	// MaxBatchDefault.
	MaxBatch int
	// MaxPending is each partition consumer's MaxAckPending. Defaults to
	// MaxPendingDefault.
	MaxPending int
	// RevokeTimeout bounds how long releasing a partition waits for its
	// messages in flight. Defaults to RevokeTimeoutDefault.
	RevokeTimeout time.Duration
	// Logger receives the driver's warnings. Defaults to slog.Default().
	Logger *slog.Logger
}

func (o *SubscriptionOptions) withDefaults() SubscriptionOptions {
	var c SubscriptionOptions
	if o != nil {
		c = *o
	}
	if c.Lease <= 0 {
		c.Lease = LeaseDefault
	}
	if c.Lease < time.Second {
		c.Lease = time.Second
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = MaxBatchDefault
	}
	if c.MaxPending <= 0 {
		c.MaxPending = MaxPendingDefault
	}
	if c.RevokeTimeout <= 0 {
		c.RevokeTimeout = RevokeTimeoutDefault
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// LeaseBucket is the key-value bucket holding the partition ownership and
// the members of subscription sub on stream.
func LeaseBucket(stream, sub string) string { return "keyorder_" + stream + "_" + sub }

// StateBucket is the key-value bucket holding what the driver records per
// partition (the deliveries it gave back unrun).
func StateBucket(stream, sub string) string { return LeaseBucket(stream, sub) + "_state" }

// DeadLetterStream is the stream of stream's dead letters; a
// subscription's are on subject <DeadLetterStream>.<subscription>.
func DeadLetterStream(stream string) string { return stream + "_dead" }

// consumerName is the durable consumer of partition p.
func consumerName(sub string, p int) string { return sub + "_p" + strconv.Itoa(p) }

// inMsg is a fetched message.
type inMsg struct {
	msg  jetstream.Msg
	meta *jetstream.MsgMetadata
	// From the run record of a redelivery (see runs.go): the attempts
	// used, whether a record exists, and the retry time it carries.
	runs      int
	hasRec    bool
	notBefore time.Time
}

// part is a partition this process owns.
type part struct {
	n        int
	cons     jetstream.Consumer
	rev      uint64    // the ownership entry's revision: the fencing token
	until    time.Time // ownership deadline by this process's clock
	primed   bool      // the first fetch is in
	settled0 bool      // the leftovers of the previous owner are in (or waited for long enough)
	leftover int       // messages the previous owner left unacknowledged
	leftSeq  uint64    // the last stream sequence delivered before this owner
	got      int       // leftovers received
	leftBy   time.Time // when to stop waiting for leftovers
	revoking bool
	backlog  []inMsg
	live     int
	wake     chan struct{}
	stop     chan struct{}
	done     chan struct{}
}

// delivery is a handed-out message's AckID.
type delivery struct {
	p        *part
	in       inMsg
	deadline time.Time
	started  atomic.Bool
	settled  bool
	lost     bool

	// The run record (runs.go); guarded by the driver's mu, writes
	// serialized by recMu.
	recMu     sync.Mutex
	starts    int       // handler starts in this delivery
	startedAt time.Time // the last start
	recorded  int       // the runs recorded
	writing   bool      // a record write is in flight
	acked     bool      // acknowledged or dead-lettered: no record from now on
	returned  bool      // given back by Return with notBefore
	notBefore time.Time
}

type subscriptionDriver struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	stream  string
	sub     string
	opts    SubscriptionOptions
	nparts  int
	id      string
	ttl     time.Duration
	leases  jetstream.KeyValue
	state   jetstream.KeyValue
	ownConn bool

	mu      sync.Mutex
	closed  bool
	joined  bool
	parts   map[int]*part
	live    map[*delivery]struct{}
	signal  chan struct{}
	settled chan struct{} // closed and replaced when a delivery settles
	revoke  func(ctx context.Context, selected func(*driver.Message) bool) []*driver.Message
	loopEnd chan struct{}
	leave   chan struct{}
	wg      sync.WaitGroup
	recWG   sync.WaitGroup // run record writes in the background

	// The gate around a charged start (runs.go): while gate is unsettled
	// and before gateUntil, other handlers wait to start; starting counts
	// the starts recording synchronously.
	gate      *delivery
	gateUntil time.Time
	starting  int
}

var (
	_ driver.Subscription    = (*subscriptionDriver)(nil)
	_ driver.DeadLetterStore = (*subscriptionDriver)(nil)
	_ driver.StartRecorder   = (*subscriptionDriver)(nil)
	_ driver.Returner        = (*subscriptionDriver)(nil)
	_ driver.Namer           = (*subscriptionDriver)(nil)
	_ driver.Revocable       = (*subscriptionDriver)(nil)
)

// openSubscription opens a consumer process of subscription sub on
// stream. It creates the lease and state buckets if needed but joins (takes
// partitions) only on the first Receive, so an operator's process
// (dead-letter listing, redrive) takes no partition from the live ones.
func openSubscription(ctx context.Context, js jetstream.JetStream, stream, sub string, opts *SubscriptionOptions) (*subscriptionDriver, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: nats.OpenSubscription: nil JetStream", keyorder.ErrInvalidConfig)
	}
	if !validName.MatchString(stream) || !validName.MatchString(sub) || len(stream)+len(sub) > 200 {
		return nil, fmt.Errorf("%w: nats.OpenSubscription: stream %q, subscription %q: want letters, digits, '_' or '-'",
			keyorder.ErrInvalidConfig, stream, sub)
	}
	o := opts.withDefaults()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("nats: subscribe %s: stream %s: %w", sub, stream, err)
	}
	n, err := streamPartitions(st.CachedInfo())
	if err != nil {
		return nil, err
	}
	s := &subscriptionDriver{
		nc: js.Conn(), js: js, stream: stream, sub: sub, opts: o, nparts: n, id: nuid.Next(),
		ttl:   o.Lease + o.Lease/2,
		parts: map[int]*part{}, live: map[*delivery]struct{}{},
		signal: make(chan struct{}, 1), settled: make(chan struct{}),
	}
	s.leases, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: LeaseBucket(stream, sub), TTL: s.ttl, History: 1})
	if err == nil {
		s.state, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: StateBucket(stream, sub), History: 1})
	}
	if err != nil {
		return nil, fmt.Errorf("nats: subscribe %s: buckets: %w", sub, err)
	}
	return s, nil
}

// Capabilities: the subscription's policy, no native hold, the lease.
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

// Name returns the subscription's name.
func (s *subscriptionDriver) Name() string { return s.sub }

// Close releases every partition (what is still held goes back to the
// stream at once) and leaves.
func (s *subscriptionDriver) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	joined := s.joined
	leave, end := s.leave, s.loopEnd
	s.mu.Unlock()
	if leave != nil {
		close(leave)
		<-end
	}
	s.wg.Wait()
	s.mu.Lock()
	parts := make([]*part, 0, len(s.parts))
	for _, p := range s.parts {
		parts = append(parts, p)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range parts {
		wg.Add(1)
		go func() { defer wg.Done(); s.release(p, false) }()
	}
	wg.Wait()
	s.recWG.Wait()
	if joined {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = s.leases.Delete(ctx, "m."+s.id)
		cancel()
	}
	if s.ownConn {
		s.nc.Close()
	}
	return nil
}
