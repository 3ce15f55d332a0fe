package kafka

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
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

// assigned creates the states of newly assigned partitions.
func (s *subscriptionDriver) assigned(g *generation, ps []int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range ps {
		if st := g.parts[p]; st != nil && !st.revoking {
			continue // still ours: keep what is in flight
		}
		g.parts[p] = &partState{p: p, gen: g, om: newOffsetMap(-1, ""), committed: -1}
	}
}

// fetched reads the committed offsets and metadata of the assigned
// partitions (before fetching records starts).
func (s *subscriptionDriver) fetched(g *generation, resp *kmsg.OffsetFetchResponse) {
	type committed struct {
		off  int64
		meta string
	}
	got := map[int32]committed{}
	add := func(topic string, id [16]byte, p int32, off int64, meta *string) {
		if topic != s.topic && id != s.topicID {
			return
		}
		c := committed{off: off}
		if meta != nil {
			c.meta = *meta
		}
		got[p] = c
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			add(t.Topic, [16]byte{}, p.Partition, p.Offset, p.Metadata)
		}
	}
	for _, gr := range resp.Groups {
		for _, t := range gr.Topics {
			for _, p := range t.Partitions {
				add(t.Topic, t.TopicID, p.Partition, p.Offset, p.Metadata)
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for p, ps := range g.parts {
		if ps.fetched {
			continue
		}
		ps.fetched = true
		if c, ok := got[p]; ok && c.off >= 0 {
			ps.om = newOffsetMap(c.off, c.meta)
			ps.committed, ps.committedMeta = c.off, c.meta
			if metaInUse(c.meta) {
				ps.unclean, ps.suspect = true, math.MaxInt64
			}
		}
	}
}

// signal wakes revocations waiting for records to settle. Called with
// s.mu held.
func (s *subscriptionDriver) signal() {
	if s.waiting == 0 {
		return
	}
	close(s.notify)
	s.notify = make(chan struct{})
}

// revoked handles partitions the group takes away (graceful: stop handing
// them out, wait for what is in flight, commit) or that are lost (no
// commit: another member may own them already).
func (s *subscriptionDriver) revoked(ctx context.Context, g *generation, ps []int32, graceful bool) {
	s.mu.Lock()
	if g.expired {
		s.mu.Unlock()
		return // the watchdog committed and gave the member up
	}
	var states []*partState
	var resume []int32
	for _, p := range ps {
		st := g.parts[p]
		if st == nil {
			continue
		}
		st.revoking = true
		st.backlog = nil
		if st.paused {
			st.paused = false
			resume = append(resume, p)
		}
		states = append(states, st)
	}
	revoke, closing := s.revoke, s.closed
	s.mu.Unlock()
	if len(resume) > 0 {
		g.fetch.ResumeFetchPartitions(map[string][]int32{s.topic: resume})
	}
	if revoke != nil && !closing && len(states) > 0 {
		s.takeBack(ctx, revoke, states, graceful)
	}
	if graceful {
		s.mu.Lock()
		s.waiting++
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			s.waiting--
			s.mu.Unlock()
		}()
		deadline := time.Now().Add(s.opts.RevokeTimeout)
		for {
			s.mu.Lock()
			busy := 0
			now := time.Now()
			for _, st := range states {
				busy += st.inflight
			}
			// A record whose lease ran out is not waited for.
			if busy > 0 {
				busy = 0
				for d := range s.live {
					if d.ps.gen == g && slices.Contains(states, d.ps) && now.Before(d.deadline) && !d.revoked {
						busy++
					}
				}
			}
			ch := s.notify
			s.mu.Unlock()
			if busy == 0 || now.After(deadline) || ctx.Err() != nil {
				break
			}
			t := time.NewTimer(min(time.Until(deadline), 100*time.Millisecond))
			select {
			case <-ch:
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
		}
	}
	// What is still in flight goes to the partitions' new owners; a
	// record whose handler started may have been running: its attempt
	// counts.
	s.mu.Lock()
	n := 0
	extra := map[*partState]map[int64]mark{}
	for d := range s.live {
		if slices.Contains(states, d.ps) {
			if d.started.Load() {
				if extra[d.ps] == nil {
					extra[d.ps] = map[int64]mark{}
				}
				extra[d.ps][d.off] = mark{n: d.prior + 1}
			}
			d.lost = true
			delete(s.live, d)
			n++
		}
	}
	s.mu.Unlock()
	if n > 0 {
		s.opts.Logger.Warn("keyorder: kafka: partitions revoked with records in flight; they go to their new owner",
			"topic", s.topic, "group", s.group, "records", n)
	}
	if graceful {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := s.commit(cctx, g, states, extra, true); err != nil {
			s.opts.Logger.Warn("keyorder: kafka: commit on revocation failed; records may be redelivered",
				"topic", s.topic, "group", s.group, "err", err)
		}
		cancel()
	}
	s.mu.Lock()
	for _, st := range states {
		if g.parts[st.p] == st {
			delete(g.parts, st.p)
		}
	}
	s.mu.Unlock()
}

// SetRevoke keeps the portable layer's revoke function, which the
// revocation path calls to take back synchronously what the process holds
// of the revoked partitions.
func (s *subscriptionDriver) SetRevoke(revoke func(ctx context.Context, selected func(*driver.Message) bool) []*driver.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.revoke = revoke
}

// takeBack has the portable layer forget the records of states that wait
// in the process (a parked retry, a throttled record, records behind a
// held key), so that none of them starts here once the revocation
// returned, and wait for those that run: up to RevokeTimeout for a
// graceful revocation, RevokeLostTimeout for lost partitions. The
// forgotten records are not waited for by the revocation (their leases
// count as ended); the commit counts an attempt for each whose handler
// had started. It is never called from Close (Close is a call of the
// portable layer, which settled what it could before it).
func (s *subscriptionDriver) takeBack(ctx context.Context, revoke func(context.Context, func(*driver.Message) bool) []*driver.Message, states []*partState, graceful bool) {
	wait := RevokeLostTimeout
	if graceful {
		wait = s.opts.RevokeTimeout
	}
	rctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	running := revoke(rctx, func(m *driver.Message) bool {
		d, ok := m.AckID.(*delivery)
		return ok && d != nil && slices.Contains(states, d.ps)
	})
	still := map[*delivery]bool{}
	for _, m := range running {
		if d, ok := m.AckID.(*delivery); ok {
			still[d] = true
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for d := range s.live {
		if slices.Contains(states, d.ps) && !still[d] {
			d.revoked = true // forgotten: not waited for
		}
	}
	s.signal()
}

// Receive waits for at least one record or ctx, and returns at most
// maxMessages, each partition's in offset order (a key's records are in
// one partition) and, across partitions, merged by record timestamp (see
// handOut).
func (s *subscriptionDriver) Receive(ctx context.Context, maxMessages int) ([]*driver.Message, error) {
	if maxMessages <= 0 || maxMessages > s.opts.MaxBatch {
		maxMessages = s.opts.MaxBatch
	}
	for {
		g, err := s.current()
		if err != nil {
			return nil, err
		}
		// Take what the client has buffered already, without waiting, so
		// that the merge sees every partition's records fetched by now
		// and not only the first partitions of a fetch. The backlogs this
		// fills hold fewer than MaxBatch records (plus one poll).
		s.mu.Lock()
		room := s.opts.MaxBatch - backlogLen(g)
		s.mu.Unlock()
		var ferr error
		if room > 0 {
			// A nil context makes PollRecords return at once with what is
			// buffered (its documented non-blocking form).
			//lint:ignore SA1012 franz-go's non-blocking poll takes a nil context
			ferr = s.take(g, g.cl.PollRecords(nil, room))
		}
		if err := s.claim(ctx, g); err != nil && ctx.Err() == nil {
			s.opts.Logger.Warn("keyorder: kafka: claiming partitions failed; retried", "topic", s.topic, "group", s.group, "err", err)
		}
		s.mu.Lock()
		if out := s.handOut(g, maxMessages, nil); len(out) > 0 {
			s.mu.Unlock()
			return out, nil
		}
		if ferr != nil && !isRetryable(ferr) {
			s.mu.Unlock()
			return nil, fmt.Errorf("kafka: fetch %s: %w", s.topic, ferr)
		}
		pctx, cancel := context.WithCancel(ctx)
		s.wake = cancel
		s.mu.Unlock()
		fs := g.cl.PollRecords(pctx, s.opts.MaxBatch)
		cancel()
		s.mu.Lock()
		s.wake = nil
		s.mu.Unlock()
		if fs.IsClientClosed() {
			continue // the watchdog gave the member up, or Close
		}
		// Records polled as ctx ended wait in the backlog for the next
		// Receive (the client's cursor is past them).
		ferr = s.take(g, fs)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := s.claim(ctx, g); err != nil && ctx.Err() == nil {
			s.opts.Logger.Warn("keyorder: kafka: claiming partitions failed; retried", "topic", s.topic, "group", s.group, "err", err)
		}
		s.mu.Lock()
		out := s.handOut(g, maxMessages, nil)
		s.mu.Unlock()
		if len(out) > 0 {
			return out, nil
		}
		if ferr != nil && !isRetryable(ferr) {
			return nil, fmt.Errorf("kafka: fetch %s: %w", s.topic, ferr)
		}
	}
}

// take appends the records of fs to their partitions' backlogs and
// returns the first fetch error (each is logged).
func (s *subscriptionDriver) take(g *generation, fs kgo.Fetches) error {
	var ferr error
	fs.EachError(func(t string, p int32, err error) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, kgo.ErrClientClosed) {
			return
		}
		if ferr == nil {
			ferr = err
		}
		s.opts.Logger.Warn("keyorder: kafka: fetch error", "topic", t, "partition", p, "err", err)
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		if st := g.parts[p.Partition]; st != nil && p.Topic == s.topic && st.unclean && st.suspect == math.MaxInt64 && p.HighWatermark >= 0 {
			st.suspect = p.HighWatermark
		}
	})
	fs.EachRecord(func(r *kgo.Record) {
		if st := g.parts[r.Partition]; st != nil && !st.revoking && r.Topic == s.topic {
			st.backlog = append(st.backlog, r)
		}
	})
	return ferr
}

// backlogLen is how many fetched records wait in g's backlogs. Called
// with s.mu held.
func backlogLen(g *generation) int {
	n := 0
	for _, st := range g.parts {
		n += len(st.backlog)
	}
	return n
}

// handOut moves up to max records from the partitions' backlogs into
// their offset maps and returns them, pausing the partitions that reached
// their bounds and resuming those that are below them again. Called with
// s.mu held.
//
// The backlogs are merged by record timestamp (ties by partition), each
// partition's in offset order: Kafka orders records only within a
// partition, so a process handed each partition's backlog in turn would
// see a record published late on one partition before one published
// early on another, and the subscriber, which runs the oldest deliverable
// message first, would run them in that order. Merged, the process sees
// what was fetched together in about publish order, as on the other
// backends (the timestamps are the producers' clocks, in milliseconds).
func (s *subscriptionDriver) handOut(g *generation, max int, out []*driver.Message) []*driver.Message {
	if g.expired {
		return out
	}
	s.gated = false
	if a := s.alone; a != nil && !a.settled && !a.lost {
		s.gated = true // a charged suspect runs alone
		return out
	}
	s.alone = nil
	h := make(partHeap, 0, len(g.parts))
	for _, st := range g.parts {
		if st.claimed && !st.revoking && len(st.backlog) > 0 && !s.full(st) {
			h = append(h, st)
		}
	}
	heap.Init(&h)
	now := time.Now()
	for len(h) > 0 && len(out) < max {
		st := h[0]
		r := st.backlog[0]
		suspect := st.unclean && r.Offset < st.suspect
		if n := s.suspectsOut(st); suspect && n > 0 && n+len(st.om.attempts) >= s.markRoom() {
			// Its start could not be recorded: the partition waits
			// until a suspect handed out completes.
			heap.Pop(&h)
			continue
		}
		charged := suspect && st.om.attempts[r.Offset] > 0
		if charged && (len(s.live) > 0 || len(out) > 0) {
			// A record that was running when the previous owner died
			// waits until nothing else runs here: if it kills this
			// process too, no other record is charged for it.
			s.gated = true
			break
		}
		st.backlog[0] = nil
		st.backlog = st.backlog[1:]
		if len(st.backlog) == 0 {
			st.backlog = nil
		}
		d := &delivery{ps: st, off: r.Offset, deadline: now.Add(s.opts.Lease)}
		skip, prior := st.om.add(r.Offset, d)
		if skip {
			st.dirty = true
		} else {
			d.prior, d.due = prior.n, prior.due
			d.suspect = st.unclean && r.Offset < st.suspect
			st.inflight++
			s.live[d] = struct{}{}
			out = append(out, s.message(r, d))
			if charged {
				s.alone = d
				break
			}
		}
		if len(st.backlog) == 0 || s.full(st) {
			heap.Pop(&h)
		} else {
			heap.Fix(&h, 0)
		}
	}
	// Only a partition at its bounds is paused: one with a backlog is not
	// polled for more anyway (Receive polls again when nothing can be
	// handed out, or while the backlogs hold fewer than MaxBatch), and a
	// pause drops what the client buffered for the partition and keeps
	// it out of the fetch in flight (up to FetchMaxWait) once resumed.
	var pause, resume []int32
	for _, st := range g.parts {
		if st.revoking {
			continue
		}
		switch full := s.full(st); {
		case full && !st.paused:
			st.paused = true
			pause = append(pause, st.p)
		case !full && st.paused:
			st.paused = false
			resume = append(resume, st.p)
		}
	}
	if len(pause) > 0 {
		g.fetch.PauseFetchPartitions(map[string][]int32{s.topic: pause})
	}
	if len(resume) > 0 {
		g.fetch.ResumeFetchPartitions(map[string][]int32{s.topic: resume})
	}
	return out
}

// markRoom is how many attempt counts the commit metadata is sure to
// carry: an entry takes at most 15 bytes (offset distance, count, due
// time), maxAttemptEntries at most.
func (s *subscriptionDriver) markRoom() int {
	return min(maxAttemptEntries, (s.opts.MaxMetadataBytes-len(metaPrefix))*3/4/15)
}

// suspectsOut counts st's suspects handed out and not done. With the
// attempt counts restored for records not handed out yet, that is what
// the metadata must carry; one suspect is always let through. Called with
// s.mu held.
func (s *subscriptionDriver) suspectsOut(st *partState) int {
	if !st.unclean || len(st.backlog) == 0 || st.backlog[0].Offset >= st.suspect {
		return 0
	}
	n := 0
	for _, e := range st.om.live() {
		if !e.done && e.d != nil && e.d.suspect {
			n++
		}
	}
	return n
}

// partHeap orders partitions by the timestamp of their backlog's first
// record, then by partition.
type partHeap []*partState

func (h partHeap) Len() int { return len(h) }
func (h partHeap) Less(i, j int) bool {
	a, b := h[i].backlog[0].Timestamp, h[j].backlog[0].Timestamp
	if !a.Equal(b) {
		return a.Before(b)
	}
	return h[i].p < h[j].p
}
func (h partHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *partHeap) Push(x any)   { *h = append(*h, x.(*partState)) }
func (h *partHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return x
}

// full reports whether st may hand out no more records: too many pending
// above its committed offset, or too many done runs for the metadata.
func (s *subscriptionDriver) full(st *partState) bool {
	return st.om.pending() >= s.opts.MaxPending || st.om.runs >= s.opts.MaxMetadataBytes/12
}

// message converts a record: its key becomes Key, the reserved headers ID
// and NotBefore, the rest Headers.
func (s *subscriptionDriver) message(r *kgo.Record, d *delivery) *driver.Message {
	m := fromRecord(r)
	m.AckID = d
	m.Attempt = d.prior + 1
	if d.due > 0 {
		// A retry given back at a graceful stop (Return) is held until
		// it was due, as a not-before time is.
		if due := time.UnixMilli(d.due); due.After(m.NotBefore) {
			m.NotBefore = due
		}
	}
	m.Copy = position{r.Partition, r.Offset}
	return m
}

func fromRecord(r *kgo.Record) *driver.Message {
	m := &driver.Message{Key: string(r.Key), Payload: r.Value, PublishTime: r.Timestamp}
	for _, h := range r.Headers {
		switch h.Key {
		case HeaderID:
			m.ID = string(h.Value)
			continue
		case HeaderNotBefore:
			if t, err := time.Parse(time.RFC3339Nano, string(h.Value)); err == nil {
				m.NotBefore = t
			}
			continue
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string, len(r.Headers))
		}
		m.Headers[h.Key] = string(h.Value)
	}
	if m.ID == "" {
		m.ID = r.Topic + "/" + strconv.Itoa(int(r.Partition)) + "/" + strconv.FormatInt(r.Offset, 10)
	}
	return m
}

func deliveryOf(m *driver.Message) (*delivery, error) {
	d, ok := m.AckID.(*delivery)
	if !ok || d == nil {
		return nil, fmt.Errorf("kafka: message %q was not received by this driver", m.ID)
	}
	return d, nil
}

// settle ends d's delivery; done completes its offset. Called with s.mu
// held. It reports errLost when the partition is no longer this
// member's.
func (s *subscriptionDriver) settle(d *delivery, done bool) error {
	if d.settled {
		return nil
	}
	d.settled = true
	delete(s.live, d)
	if d.lost {
		return errLost
	}
	st := d.ps
	st.inflight--
	if s.gated && s.wake != nil {
		s.wake()
	}
	if done {
		st.om.complete(d.off)
		st.dirty = true
		if st.paused && !s.full(st) && s.wake != nil {
			s.wake()
		}
	}
	s.signal()
	return nil
}

// Ack completes ms: their offsets join the partition's offset map,
// committed within CommitInterval. A record whose partition was revoked
// fails with a lost-lease error: its new owner redelivers it.
func (s *subscriptionDriver) Ack(ctx context.Context, ms []*driver.Message) error {
	var first error
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range ms {
		d, err := deliveryOf(m)
		if err == nil {
			err = s.settle(d, true)
		}
		if err != nil && first == nil {
			first = fmt.Errorf("kafka: ack %q: %w", m.ID, err)
		}
	}
	return first
}

// Nack gives m up without completing it; the subscribe package never calls
// it (no native hold). Like Release, m is redelivered only after the
// partition changes owner or the member restarts.
func (s *subscriptionDriver) Nack(ctx context.Context, m *driver.Message, delay time.Duration) error {
	return s.Release(ctx, []*driver.Message{m})
}

// Release gives ms up without completing them: their offsets stay below
// the committed offset's reach, so the partition's next owner (after a
// rebalance, or this member after a restart) redelivers them, uncounted.
// The subscribe package releases at shutdown and when a lease is lost.
func (s *subscriptionDriver) Release(ctx context.Context, ms []*driver.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range ms {
		d, err := deliveryOf(m)
		if err != nil {
			return err
		}
		s.settle(d, false)
	}
	return nil
}

// Return gives rs back as Release does, and keeps each one's used attempts
// and retry due time in its partition's commit metadata, so that the next
// owner (another member after the rebalance, or this process restarted)
// delivers it with Attempt = Attempts+1, held until its due time (as
// Message.NotBefore). What the metadata carries is bounded by
// MaxMetadataBytes: past it the lowest offsets' counts are kept.
func (s *subscriptionDriver) Return(ctx context.Context, rs []driver.Returned) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range rs {
		d, err := deliveryOf(r.Message)
		if err != nil {
			return err
		}
		if !d.settled && !d.lost {
			// r.Attempts counts this process's runs: the start mark
			// (one more than prior) no longer applies.
			d.started.Store(false)
			d.prior = max(d.prior, r.Attempts)
			d.due = 0
			if !r.NotBefore.IsZero() {
				d.due = max(r.NotBefore.UnixMilli(), 1)
			}
			d.ps.dirty = true
		}
		s.settle(d, false)
	}
	return nil
}

// ExtendLeases renews the leases of ms and returns those whose partition
// was revoked or whose member was given up.
func (s *subscriptionDriver) ExtendLeases(ctx context.Context, ms []*driver.Message) ([]*driver.Message, error) {
	now := time.Now()
	var lost []*driver.Message
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range ms {
		d, err := deliveryOf(m)
		if err != nil {
			return lost, err
		}
		if d.lost || d.revoked {
			lost = append(lost, m)
			continue
		}
		d.deadline = now.Add(s.opts.Lease)
	}
	return lost, nil
}

// Started records that the handlers of ms start: a record whose lease runs
// out after it started counts an attempt.
//
// The start is recorded in the commit metadata, so that a process that
// dies while the handler runs still counts its run: lazily (the next
// periodic commit) for most records, and synchronously, before this
// returns, for a suspect: a record of a partition whose previous owner
// went away without committing, which may have run there unrecorded (a
// record that kills every process it runs in before the lazy commit would
// otherwise run forever as attempt 1).
func (s *subscriptionDriver) Started(ctx context.Context, ms []*driver.Message) error {
	var sync []*partState
	s.mu.Lock()
	for _, m := range ms {
		if d, ok := m.AckID.(*delivery); ok && d != nil {
			d.started.Store(true)
			if d.settled || d.lost {
				continue
			}
			d.ps.dirty = true
			if d.suspect && !slices.Contains(sync, d.ps) {
				sync = append(sync, d.ps)
			}
		}
	}
	var g *generation
	if len(sync) > 0 {
		g = sync[0].gen
	}
	s.mu.Unlock()
	if len(sync) == 0 {
		return nil
	}
	if err := s.commit(ctx, g, sync, nil, false); err != nil {
		return fmt.Errorf("kafka: record start: %w", err)
	}
	return nil
}

// claim commits the claim (metaPrefixInUse) of g's partitions that have
// records to hand out and none handed out yet: a member that dies from
// then on leaves a commit that says so to the next owner.
func (s *subscriptionDriver) claim(ctx context.Context, g *generation) error {
	var states []*partState
	s.mu.Lock()
	for _, st := range g.parts {
		if st.claimed || st.revoking || !st.fetched || len(st.backlog) == 0 {
			continue
		}
		if st.om.base < 0 {
			st.om.base = st.backlog[0].Offset
		}
		states = append(states, st)
	}
	s.mu.Unlock()
	if len(states) == 0 {
		return nil
	}
	if err := s.commit(ctx, g, states, nil, false); err != nil {
		return err
	}
	s.mu.Lock()
	for _, st := range states {
		if st.committedMeta != "" && metaInUse(st.committedMeta) {
			st.claimed = true
		}
	}
	s.mu.Unlock()
	return nil
}

// watchdog gives the member up when a lease ran out: it stops handing out
// records, commits (counting an attempt for each expired record that had
// started), and leaves the group, so that the group moves its partitions.
// The next Receive joins again.
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
		expired := 0
		for d := range s.live {
			if g != nil && d.ps.gen == g && now.After(d.deadline) && !d.revoked {
				expired++
			}
		}
		if expired == 0 {
			s.mu.Unlock()
			continue
		}
		g.expired = true
		s.gen = nil
		extra := map[*partState]map[int64]mark{}
		var states []*partState
		for _, st := range g.parts {
			states = append(states, st)
		}
		for d := range s.live {
			if d.ps.gen != g {
				continue
			}
			if d.started.Load() {
				if extra[d.ps] == nil {
					extra[d.ps] = map[int64]mark{}
				}
				extra[d.ps][d.off] = mark{n: d.prior + 1}
			}
			d.lost = true
			delete(s.live, d)
		}
		s.signal()
		s.mu.Unlock()
		s.opts.Logger.Warn("keyorder: kafka: a lease ran out; leaving the group so that it moves this member's partitions",
			"topic", s.topic, "group", s.group, "expired", expired)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := s.commit(ctx, g, states, extra, true); err != nil {
			s.opts.Logger.Warn("keyorder: kafka: commit before leaving failed", "err", err)
		}
		cancel()
		g.cl.Close()
	}
}

// committer commits completed offsets every CommitInterval.
func (s *subscriptionDriver) committer() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		g, states := s.dirtyStates()
		if len(states) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := s.commit(ctx, g, states, nil, false); err != nil && !errors.Is(err, kgo.ErrClientClosed) {
			s.opts.Logger.Debug("keyorder: kafka: commit failed; retried on the next tick", "err", err)
		}
		cancel()
	}
}

// dirtyStates returns the live member and its partitions with completions
// not committed yet (the committer's pick, made outside commitMu).
func (s *subscriptionDriver) dirtyStates() (*generation, []*partState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.gen
	var states []*partState
	if g != nil {
		for _, st := range g.parts {
			if st.dirty && !st.revoking {
				states = append(states, st)
			}
		}
	}
	return g, states
}

// commit commits the offset maps of states (attempts of extra added) as
// member of g. Commits are serialized, so a later one never lands before
// an earlier one. A commit that does not give the partitions up (final
// false: the committer's) re-checks under the lock that g still owns
// each partition and is not revoking it: the committer picks its
// partitions before taking the lock, and a revocation (or the watchdog)
// that commits meanwhile writes the attempt counts of what it takes
// back; a commit computed before it must not land after it.
func (s *subscriptionDriver) commit(ctx context.Context, g *generation, states []*partState, extra map[*partState]map[int64]mark, final bool) error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	type part struct {
		st   *partState
		off  int64
		meta string
	}
	var parts []part
	s.mu.Lock()
	for _, st := range states {
		if !st.fetched || st.om.base < 0 {
			continue
		}
		if !final && (st.revoking || g.expired || g.parts[st.p] != st || s.gen != g) {
			continue
		}
		att := extra[st]
		// Carry the attempts counted before for records in flight.
		for _, e := range st.om.live() {
			if e.d != nil && (e.d.prior > 0 || e.d.due > 0 || e.d.started.Load()) {
				if att == nil {
					att = map[int64]mark{}
				}
				if _, ok := att[e.off]; !ok {
					mk := mark{e.d.prior, e.d.due}
					if e.d.started.Load() {
						// It started: should this process die, its run
						// counts (recorded lazily, by the next commit;
						// before the handler for a suspect).
						mk = mark{n: e.d.prior + 1}
					}
					att[e.off] = mk
				}
			}
		}
		meta := st.om.encode(att, s.opts.MaxMetadataBytes, !final)
		st.dirty = false
		if st.om.base == st.committed && meta == st.committedMeta {
			continue
		}
		parts = append(parts, part{st, st.om.base, meta})
	}
	s.mu.Unlock()
	if len(parts) == 0 {
		return nil
	}
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group = s.group
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic = s.topic
	rt.TopicID = s.topicID
	for _, p := range parts {
		rp := kmsg.NewOffsetCommitRequestTopicPartition()
		rp.Partition = p.st.p
		rp.Offset = p.off
		rp.LeaderEpoch = -1
		meta := p.meta
		rp.Metadata = &meta
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	send := s.sendCommit
	if send == nil {
		send = sendCommit
	}
	resp, err := send(ctx, g, req)
	if err == nil {
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if e := kerr.ErrorForCode(p.ErrorCode); e != nil && err == nil {
					err = fmt.Errorf("partition %d: %w", p.Partition, e)
				}
			}
		}
	}
	s.mu.Lock()
	for _, p := range parts {
		if err == nil {
			p.st.committed, p.st.committedMeta = p.off, p.meta
		} else {
			p.st.dirty = true
		}
	}
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("kafka: commit %s of %s: %w", s.group, s.topic, err)
	}
	return nil
}

// sendCommit sends req as member of g.
func sendCommit(ctx context.Context, g *generation, req *kmsg.OffsetCommitRequest) (*kmsg.OffsetCommitResponse, error) {
	req.MemberID, req.Generation = g.cl.GroupMetadata()
	return req.RequestWith(ctx, g.cl)
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
