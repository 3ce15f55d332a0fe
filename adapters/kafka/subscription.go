package kafka

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// Defaults of SubscriptionOptions.
const (
	// LeaseDefault is the default lease of a handed-out record.
	LeaseDefault = 30 * time.Second
	// MaxBatchDefault is the most records one Receive returns.
	MaxBatchDefault = 500
	// MaxPendingDefault is how many records a partition may have between
	// its committed offset and the last one handed out.
	MaxPendingDefault = 10_000
	// MaxMetadataBytesDefault is the longest commit metadata the driver writes
	// (the broker's offset.metadata.max.bytes defaults to 4096).
	MaxMetadataBytesDefault = 4000
	// MetadataBytesMin is the smallest MaxMetadataBytes accepted: room for
	// the format prefix and a few attempt counts and done runs. Below it a
	// partition could carry nothing above its committed offset.
	MetadataBytesMin = 64
	// CommitIntervalDefault is how often completed offsets are committed.
	CommitIntervalDefault = time.Second
	// RevokeTimeoutDefault bounds the wait for a revoked partition's
	// records in flight.
	RevokeTimeoutDefault = 20 * time.Second
	// RevokeLostTimeout bounds how long the driver waits, when partitions
	// are lost (another member may own them already), for the handlers of
	// their records that were running to end (see driver.Revocable).
	RevokeLostTimeout = time.Second
)

// SubscriptionOptions configure a subscription driver. A nil
// *SubscriptionOptions means defaults.
type SubscriptionOptions struct {
	// Ordering is the keyorder policy, enforced in process. Defaults to
	// policy.Ordered (the zero value), as in URLs.
	Ordering policy.Ordering
	// Lease is how long a handed-out record stays leased without
	// ExtendLeases before the driver deems the process stuck and leaves
	// the group (see the package documentation). Defaults to LeaseDefault.
	Lease time.Duration
	// MaxBatch is the most records one Receive returns. Defaults to
	// MaxBatchDefault.
	MaxBatch int
	// MaxPending is how many records a partition may have between its
	// committed offset and the last one handed out before the driver stops
	// handing out more of it. Defaults to MaxPendingDefault.
	MaxPending int
	// MaxMetadataBytes bounds the commit metadata, at most the broker's
	// offset.metadata.max.bytes and at least MetadataBytesMin (a smaller
	// or negative value fails the open with a *MetadataLimitError).
	// Defaults to MaxMetadataBytesDefault.
	MaxMetadataBytes int
	// CommitInterval is how often completed offsets are committed.
	// Defaults to CommitIntervalDefault.
	CommitInterval time.Duration
	// RevokeTimeout bounds how long a revocation waits for the revoked
	// partitions' records in flight. Defaults to RevokeTimeoutDefault.
	RevokeTimeout time.Duration
	// SessionTimeout is the group session timeout (how long the group
	// waits for a member that stopped heartbeating, as a killed process
	// does). Zero keeps franz-go's default (45s).
	SessionTimeout time.Duration
	// MaxMessageBytes is the broker's maximum record size, for dead
	// letters and redrives. Defaults to MaxMessageBytesDefault.
	MaxMessageBytes int
	// ClientOptions are added to the options of the clients the driver
	// makes (seed brokers, TLS, SASL, client ID, ...). The driver sets
	// the group, topic, balancer and commit options itself.
	ClientOptions []kgo.Opt
	// Logger receives the driver's warnings. Defaults to slog.Default().
	Logger *slog.Logger
}

// MetadataLimitError reports a SubscriptionOptions.MaxMetadataBytes below
// MetadataBytesMin. It matches keyorder.ErrInvalidConfig with errors.Is.
type MetadataLimitError struct {
	// Got is the value given.
	Got int
}

func (e *MetadataLimitError) Error() string {
	return fmt.Sprintf("kafka: MaxMetadataBytes %d is below the minimum %d (the commit metadata could carry no attempt counts)", e.Got, MetadataBytesMin)
}

// Is reports whether target is keyorder.ErrInvalidConfig.
func (e *MetadataLimitError) Is(target error) bool { return target == keyorder.ErrInvalidConfig }

// validate reports options that no default can stand in for.
func (o *SubscriptionOptions) validate() error {
	if o != nil && o.MaxMetadataBytes != 0 && o.MaxMetadataBytes < MetadataBytesMin {
		return &MetadataLimitError{Got: o.MaxMetadataBytes}
	}
	return nil
}

func (o *SubscriptionOptions) withDefaults() SubscriptionOptions {
	var out SubscriptionOptions
	if o != nil {
		out = *o
	}
	if out.Lease <= 0 {
		out.Lease = LeaseDefault
	}
	if out.MaxBatch <= 0 {
		out.MaxBatch = MaxBatchDefault
	}
	if out.MaxPending <= 0 {
		out.MaxPending = MaxPendingDefault
	}
	if out.MaxMetadataBytes <= 0 {
		out.MaxMetadataBytes = MaxMetadataBytesDefault
	}
	if out.CommitInterval <= 0 {
		out.CommitInterval = CommitIntervalDefault
	}
	if out.RevokeTimeout <= 0 {
		out.RevokeTimeout = RevokeTimeoutDefault
	}
	if out.MaxMessageBytes <= MetadataRoom {
		out.MaxMessageBytes = MaxMessageBytesDefault
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

// DeadLetterTopic returns the dead-letter topic of group on topic:
// <topic>.<group>.dead.
func DeadLetterTopic(topic, group string) string { return topic + "." + group + ".dead" }

// generation is one group member of the driver (one kgo client); one
// given up by the watchdog is closed and replaced.
type generation struct {
	cl      *kgo.Client
	fetch   pauser // cl; a recorder in unit tests
	parts   map[int32]*partState
	expired bool
}

// pauser pauses and resumes fetching partitions (*kgo.Client).
type pauser interface {
	PauseFetchPartitions(map[string][]int32) map[string][]int32
	ResumeFetchPartitions(map[string][]int32)
}

// partState is one assigned partition of a generation.
type partState struct {
	p        int32
	gen      *generation
	om       *offsetMap
	fetched  bool // committed offset and metadata read
	revoking bool
	inflight int
	backlog  []*kgo.Record // fetched, not handed out (backpressure)
	paused   bool
	dirty    bool // completed since the last commit
	// claimed: this member committed its claim (metaPrefixInUse) and may
	// hand the partition's records out.
	claimed bool
	// unclean: the previous owner went away without committing (its
	// last commit was a claim or a periodic one); then records below
	// suspect (the high watermark at the first fetch, math.MaxInt64 until
	// it is known) may have run unrecorded, and a start of theirs is
	// recorded before the handler runs.
	unclean bool
	suspect int64
	// committed is the last offset and metadata committed.
	committed     int64
	committedMeta string
}

// delivery is a handed-out record's AckID.
type delivery struct {
	ps       *partState
	off      int64
	prior    int   // attempts counted before this delivery
	due      int64 // when a retry given back before was due (Unix ms), 0 if none
	started  atomic.Bool
	deadline time.Time // guarded by the subscription's mu
	settled  bool
	lost     bool
	revoked  bool // forgotten by the portable layer in a revocation
	suspect  bool // a start is recorded synchronously (see partState.unclean)
}

// position is a record's place in its topic: driver.Message.Copy.
type position struct {
	partition int32
	offset    int64
}

// subscriptionDriver is the driver.Subscription driver of one member of a
// Kafka consumer group.
type subscriptionDriver struct {
	topic     string
	group     string
	deadTopic string
	opts      SubscriptionOptions
	topicID   [16]byte

	mu      sync.Mutex
	closed  bool
	gen     *generation
	wake    func()        // cancels a blocked poll (backpressure lifted)
	notify  chan struct{} // closed and replaced when records settle
	waiting int           // revocations waiting on notify
	live    map[*delivery]struct{}
	// revoke takes back what the portable layer holds of revoked
	// partitions (driver.Revocable); nil until SetRevoke.
	revoke func(ctx context.Context, selected func(*driver.Message) bool) []*driver.Message
	// alone is a charged suspect in flight: nothing else is handed out
	// until it settles; gated: the last hand-out stopped for one.
	alone *delivery
	gated bool

	commitMu sync.Mutex
	// sendCommit sends an offset commit (sendCommit; a recorder in unit
	// tests).
	sendCommit func(context.Context, *generation, *kmsg.OffsetCommitRequest) (*kmsg.OffsetCommitResponse, error)
	prodOnce   sync.Once
	prod       *kgo.Client // dead letters, redrive
	prodErr    error
	stop       chan struct{}
	wg         sync.WaitGroup
}

var (
	_ driver.Subscription    = (*subscriptionDriver)(nil)
	_ driver.DeadLetterStore = (*subscriptionDriver)(nil)
	_ driver.StartRecorder   = (*subscriptionDriver)(nil)
	_ driver.Namer           = (*subscriptionDriver)(nil)
	_ driver.Returner        = (*subscriptionDriver)(nil)
	_ driver.Revocable       = (*subscriptionDriver)(nil)
)

// openSubscription returns the consuming driver of a member of group on
// topic, with clients made from opts.ClientOptions (seed brokers and
// connection options). The topic must exist.
//
// It checks the topic and the member's client options but does not join
// the group: the first Receive does. An operator's process (keyorder
// stats, dead list|show|redrive, held) opens a subscription only to read
// its dead letters and closes it without receiving; joining at open would
// rebalance a live group twice for each such command (the group moves
// partitions to the operator's process, waits for the live members'
// records in flight, and moves them back on Close).
func openSubscription(ctx context.Context, topic, group string, opts *SubscriptionOptions) (*subscriptionDriver, error) {
	if topic == "" || group == "" {
		return nil, fmt.Errorf("%w: kafka.OpenSubscription: empty topic or group", keyorder.ErrInvalidConfig)
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	o := opts.withDefaults()
	s := &subscriptionDriver{
		topic: topic, group: group, deadTopic: DeadLetterTopic(topic, group), opts: o,
		notify: make(chan struct{}), live: map[*delivery]struct{}{}, stop: make(chan struct{}),
	}
	// The topic's ID: OffsetCommit v10 (Kafka 4.2+) names topics by ID.
	adm, err := kgo.NewClient(o.ClientOptions...)
	if err != nil {
		return nil, fmt.Errorf("%w: kafka: client: %v", keyorder.ErrInvalidConfig, err)
	}
	s.topicID, err = awaitTopic(ctx, adm, topic)
	adm.Close()
	if err != nil {
		return nil, fmt.Errorf("kafka: subscribe %s: %w", group, err)
	}
	// What joining would reject, rejected here (kgo.NewClient fails only
	// on its options), so that a bad option fails the open and not the
	// first Receive.
	if err := kgo.ValidateOpts(s.memberOpts(&generation{})...); err != nil {
		return nil, fmt.Errorf("%w: kafka: consumer client: %v", keyorder.ErrInvalidConfig, err)
	}
	s.wg.Add(2)
	go s.watchdog()
	go s.committer()
	return s, nil
}

// current returns the live member, joining the group when there is none:
// on the first Receive, and on the next one after the watchdog gave the
// member up. The other methods need no member: Ack, Release and
// ExtendLeases act on records a Receive handed out, and the dead-letter
// methods use their own producing client.
func (s *subscriptionDriver) current() (*generation, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	if s.gen != nil {
		return s.gen, nil
	}
	g := &generation{parts: map[int32]*partState{}}
	cl, err := kgo.NewClient(s.memberOpts(g)...)
	if err != nil {
		return nil, fmt.Errorf("%w: kafka: consumer client: %v", keyorder.ErrInvalidConfig, err)
	}
	g.cl, g.fetch = cl, cl
	s.gen = g
	return g, nil
}

// memberOpts are the options of g's group client: the caller's client
// options and the group, topic, balancer, commit and callback options.
func (s *subscriptionDriver) memberOpts(g *generation) []kgo.Opt {
	opts := append(slices.Clip(s.opts.ClientOptions),
		kgo.ConsumerGroup(s.group),
		kgo.ConsumeTopics(s.topic),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(500*time.Millisecond),
		kgo.OnPartitionsAssigned(func(ctx context.Context, _ *kgo.Client, m map[string][]int32) { s.assigned(g, m[s.topic]) }),
		kgo.OnOffsetsFetched(func(ctx context.Context, _ *kgo.Client, resp *kmsg.OffsetFetchResponse) error {
			s.fetched(g, resp)
			return nil
		}),
		kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, m map[string][]int32) { s.revoked(ctx, g, m[s.topic], true) }),
		kgo.OnPartitionsLost(func(ctx context.Context, cl *kgo.Client, m map[string][]int32) { s.revoked(ctx, g, m[s.topic], false) }),
	)
	if s.opts.SessionTimeout > 0 {
		opts = append(opts, kgo.SessionTimeout(s.opts.SessionTimeout), kgo.HeartbeatInterval(max(s.opts.SessionTimeout/6, 100*time.Millisecond)))
	}
	return opts
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

// Name returns the group's name (Delivery.Subscription).
func (s *subscriptionDriver) Name() string { return s.group }

// Close commits what completed and leaves the group: the group gives the
// member's partitions to the other members, which redeliver what had not
// completed. A subscription that never received (an operator's) never
// joined: Close closes its clients and leaves the group as it was.
func (s *subscriptionDriver) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	g := s.gen
	s.gen = nil
	s.mu.Unlock()
	close(s.stop)
	s.wg.Wait()
	if g != nil {
		// Leaving revokes every partition: revoked commits them (records
		// still in flight are not waited for: the portable layer settled
		// what it could before closing).
		s.mu.Lock()
		for d := range s.live {
			if d.ps.gen == g {
				d.lost = true
				delete(s.live, d)
			}
		}
		s.mu.Unlock()
		g.cl.Close()
	}
	if s.prod != nil {
		s.prod.Close()
	}
	return nil
}
