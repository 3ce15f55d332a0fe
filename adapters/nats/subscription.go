package nats

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"strconv"
	"strings"
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

// tick is the ownership renewal interval.
func (s *subscriptionDriver) tick() time.Duration { return s.opts.Lease / 4 }

// SetRevoke keeps the portable layer's revocation function.
func (s *subscriptionDriver) SetRevoke(revoke func(ctx context.Context, selected func(*driver.Message) bool) []*driver.Message) {
	s.mu.Lock()
	s.revoke = revoke
	s.mu.Unlock()
}

// join announces the process and starts its ownership loop, after taking
// its share of partitions once. Called by Receive.
func (s *subscriptionDriver) join(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errClosed
	}
	if s.joined {
		s.mu.Unlock()
		return nil
	}
	s.joined = true
	s.leave = make(chan struct{})
	s.loopEnd = make(chan struct{})
	leave, end := s.leave, s.loopEnd
	s.mu.Unlock()
	s.balance(ctx)
	s.wg.Add(1)
	go s.loop(leave, end)
	return nil
}

// loop renews, balances and watches the leases until leave is closed.
func (s *subscriptionDriver) loop(leave, end chan struct{}) {
	defer s.wg.Done()
	defer close(end)
	// The watchdog looks every watchdogEvery (a lease that ran out is
	// given up within that); renewals and balancing run every tick.
	t := time.NewTicker(min(s.tick(), watchdogEvery))
	defer t.Stop()
	next := time.Now().Add(s.tick())
	for {
		select {
		case <-leave:
			return
		case <-t.C:
		}
		if s.watchdog() {
			return
		}
		s.recordLazily()
		if time.Now().Before(next) {
			continue
		}
		next = time.Now().Add(s.tick())
		ctx, cancel := context.WithTimeout(context.Background(), s.tick())
		s.renew(ctx)
		s.balance(ctx)
		s.keepBacklog()
		cancel()
	}
}

// watchdog gives the whole member up when a handed-out message's lease
// ran out unrenewed (the process hangs): it releases every partition and
// leaves; the next Receive joins again.
func (s *subscriptionDriver) watchdog() bool {
	now := time.Now()
	s.mu.Lock()
	hung := false
	for d := range s.live {
		if !d.lost && now.After(d.deadline) {
			hung = true
			break
		}
	}
	if !hung {
		s.mu.Unlock()
		return false
	}
	s.opts.Logger.Warn("keyorder: nats: a lease ran out unrenewed; giving the subscription's partitions up", "subscription", s.sub)
	s.joined = false
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = s.leases.Delete(ctx, "m."+s.id)
	cancel()
	return true
}

// renew renews the member entry and every owned partition's entry at its
// revision; a partition whose entry moved on, or whose deadline passed, is
// given up.
func (s *subscriptionDriver) renew(ctx context.Context) {
	_, _ = s.leases.Put(ctx, "m."+s.id, []byte(s.id))
	s.mu.Lock()
	parts := make([]*part, 0, len(s.parts))
	for _, p := range s.parts {
		parts = append(parts, p)
	}
	s.mu.Unlock()
	for _, p := range parts {
		sent := time.Now()
		s.mu.Lock()
		rev := p.rev
		s.mu.Unlock()
		nrev, err := s.leases.Update(ctx, partKey(p.n), []byte(s.id), rev)
		s.mu.Lock()
		if err == nil {
			p.rev = nrev
			p.until = sent.Add(s.ttl - s.tick())
		}
		expired := time.Now().After(p.until)
		revoking := p.revoking
		s.mu.Unlock()
		if err != nil && (errors.Is(err, jetstream.ErrKeyExists) || expired) && !revoking {
			s.opts.Logger.Warn("keyorder: nats: partition ownership lost", "subscription", s.sub, "partition", p.n, "err", err)
			go s.release(p, false)
		}
	}
}

func partKey(n int) string { return "p." + strconv.Itoa(n) }

// balance takes free partitions up to the process's share of them
// (partitions / members, rounded up) and releases one above it.
func (s *subscriptionDriver) balance(ctx context.Context) {
	members := 1
	if kl, err := s.leases.ListKeysFiltered(ctx, "m.*"); err == nil {
		seen := map[string]bool{"m." + s.id: true}
		for k := range kl.Keys() {
			seen[k] = true
		}
		members = len(seen)
	} else {
		_, _ = s.leases.Put(ctx, "m."+s.id, []byte(s.id))
	}
	share := (s.nparts + members - 1) / members
	s.mu.Lock()
	owned := 0
	var extra *part
	for _, p := range s.parts {
		if !p.revoking {
			owned++
			if extra == nil || p.n > extra.n {
				extra = p
			}
		}
	}
	s.mu.Unlock()
	if owned > share && extra != nil {
		go s.release(extra, true)
		return
	}
	h := fnv.New32a()
	h.Write([]byte(s.id))
	start := int(h.Sum32() % uint32(s.nparts))
	for i := 0; i < s.nparts && owned < share; i++ {
		n := (start + i) % s.nparts
		s.mu.Lock()
		_, have := s.parts[n]
		closed := s.closed || !s.joined
		s.mu.Unlock()
		if have || closed {
			continue
		}
		sent := time.Now()
		rev, err := s.leases.Create(ctx, partKey(n), []byte(s.id))
		if err != nil {
			continue
		}
		if err := s.acquire(ctx, n, rev, sent); err != nil {
			s.opts.Logger.Warn("keyorder: nats: partition not taken", "subscription", s.sub, "partition", n, "err", err)
			_ = s.leases.Delete(ctx, partKey(n), jetstream.LastRevision(rev))
			continue
		}
		owned++
	}
}

// acquire starts consuming partition n, owned at revision rev.
func (s *subscriptionDriver) acquire(ctx context.Context, n int, rev uint64, sent time.Time) error {
	cons, err := s.js.CreateOrUpdateConsumer(ctx, s.stream, jetstream.ConsumerConfig{
		Durable:       consumerName(s.sub, n),
		FilterSubject: s.stream + "." + strconv.Itoa(n) + ".>",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.opts.Lease,
		MaxDeliver:    -1,
		MaxAckPending: s.opts.MaxPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return err
	}
	p := &part{n: n, cons: cons, rev: rev, until: sent.Add(s.ttl - s.tick()),
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	// The previous owner's unacknowledged messages come back as their
	// AckWait runs out, in the order they expire, not in stream order (a
	// message extended later expires later). None of the partition is
	// handed out until all of them are in (or two leases passed), and the
	// backlog is kept in stream order.
	if info := cons.CachedInfo(); info != nil && info.NumAckPending > 0 {
		p.leftover = info.NumAckPending
		p.leftSeq = info.Delivered.Stream
		p.leftBy = time.Now().Add(2 * s.opts.Lease)
	} else {
		p.settled0 = true
	}
	s.mu.Lock()
	if s.closed || !s.joined {
		s.mu.Unlock()
		return errClosed
	}
	s.parts[n] = p
	s.mu.Unlock()
	go s.fetch(p)
	return nil
}

// fetch pulls partition p's messages into its backlog until p is stopped,
// keeping at most MaxPending fetched or handed out.
func (s *subscriptionDriver) fetch(p *part) {
	defer close(p.done)
	first := true
	for {
		select {
		case <-p.stop:
			return
		default:
		}
		s.mu.Lock()
		room := s.opts.MaxPending - len(p.backlog) - p.live
		s.mu.Unlock()
		if room <= 0 {
			select {
			case <-p.stop:
				return
			case <-p.wake:
			case <-time.After(fetchWait):
			}
			continue
		}
		room = min(room, 256)
		var batch jetstream.MessageBatch
		var err error
		if first {
			batch, err = p.cons.FetchNoWait(room)
		} else {
			batch, err = p.cons.Fetch(room, jetstream.FetchMaxWait(fetchWait))
		}
		if err == nil {
			for m := range batch.Messages() {
				meta, merr := m.Metadata()
				if merr != nil {
					continue
				}
				in := inMsg{msg: m, meta: meta}
				ctx, cancel := context.WithTimeout(context.Background(), s.tick())
				s.readRun(ctx, &in)
				cancel()
				s.mu.Lock()
				p.backlog = insertBySeq(p.backlog, in)
				if !p.settled0 && meta.Sequence.Stream <= p.leftSeq {
					p.got++
				}
				if !p.settled0 && (p.got >= p.leftover || time.Now().After(p.leftBy)) {
					p.settled0 = true
				}
				s.mu.Unlock()
				s.notify()
			}
			err = batch.Error()
		}
		s.mu.Lock()
		if !p.settled0 && time.Now().After(p.leftBy) {
			p.settled0 = true
		}
		s.mu.Unlock()
		if first {
			s.mu.Lock()
			p.primed = true
			s.mu.Unlock()
			s.notify()
			first = false
		}
		if err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
			select {
			case <-p.stop:
				return
			case <-time.After(fetchWait):
			}
		}
	}
}

// insertBySeq inserts in into b, kept in stream order.
func insertBySeq(b []inMsg, in inMsg) []inMsg {
	b = append(b, in)
	for i := len(b) - 1; i > 0 && b[i].meta.Sequence.Stream < b[i-1].meta.Sequence.Stream; i-- {
		b[i], b[i-1] = b[i-1], b[i]
	}
	return b
}

func (s *subscriptionDriver) notify() {
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

// keepBacklog keeps the fetched messages not handed out yet leased.
func (s *subscriptionDriver) keepBacklog() {
	s.mu.Lock()
	var ms []jetstream.Msg
	for _, p := range s.parts {
		if !p.revoking {
			for _, in := range p.backlog {
				ms = append(ms, in.msg)
			}
		}
	}
	s.mu.Unlock()
	for _, m := range ms {
		_ = m.InProgress()
	}
}

// Receive hands out fetched messages, merged across partitions by stream
// sequence (the order the stream stored them in), once every owned
// partition's first fetch is in.
func (s *subscriptionDriver) Receive(ctx context.Context, maxMessages int) ([]*driver.Message, error) {
	if maxMessages <= 0 || maxMessages > s.opts.MaxBatch {
		maxMessages = s.opts.MaxBatch
	}
	for {
		if err := s.join(ctx); err != nil {
			return nil, err
		}
		s.mu.Lock()
		out := s.handOut(maxMessages)
		s.mu.Unlock()
		if len(out) > 0 {
			return out, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.signal:
		case <-time.After(s.tick()):
		}
	}
}

// handOut moves up to max messages from the backlogs out. Called with
// s.mu held.
func (s *subscriptionDriver) handOut(max int) []*driver.Message {
	var ps []*part
	now := time.Now()
	for _, p := range s.parts {
		// A partition past its ownership deadline (renewals failing) hands
		// nothing out: another process may own it from its expiry on.
		if p.revoking || now.After(p.until) {
			continue
		}
		if !p.primed {
			return nil
		}
		if p.settled0 {
			ps = append(ps, p)
		}
	}
	var out []*driver.Message
	for len(out) < max {
		var best *part
		for _, p := range ps {
			if len(p.backlog) > 0 && (best == nil || p.backlog[0].meta.Sequence.Stream < best.backlog[0].meta.Sequence.Stream) {
				best = p
			}
		}
		if best == nil {
			break
		}
		in := best.backlog[0]
		best.backlog[0] = inMsg{}
		best.backlog = best.backlog[1:]
		d := &delivery{p: best, in: in, deadline: now.Add(s.opts.Lease)}
		best.live++
		s.live[d] = struct{}{}
		out = append(out, s.message(d))
	}
	return out
}

// message converts a fetched message.
func (s *subscriptionDriver) message(d *delivery) *driver.Message {
	in := d.in
	m := fromMsg(in.msg.Subject(), in.msg.Headers(), in.msg.Data())
	seq := in.meta.Sequence.Stream
	m.AckID = d
	m.Attempt = in.runs + 1
	if in.notBefore.After(m.NotBefore) {
		m.NotBefore = in.notBefore
	}
	m.PublishTime = in.meta.Timestamp
	m.Copy = seq
	if m.ID == "" {
		m.ID = s.stream + "/" + strconv.FormatUint(seq, 10)
	}
	return m
}

// fromMsg decodes a keyorder message from its subject, headers and data.
func fromMsg(subject string, h nats.Header, data []byte) *driver.Message {
	m := &driver.Message{Payload: data}
	if i := strings.LastIndexByte(subject, '.'); i >= 0 {
		m.Key = keyFromToken(subject[i+1:], h)
	}
	m.ID = h.Get(HeaderID)
	if m.ID == "" {
		m.ID = h.Get(nats.MsgIdHdr)
	}
	if v := h.Get(HeaderNotBefore); v != "" {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			m.NotBefore = t
		}
	}
	if v := h.Get(HeaderHeaders); v != "" {
		_ = json.Unmarshal([]byte(v), &m.Headers)
	}
	return m
}

func deliveryOf(m *driver.Message) (*delivery, error) {
	d, ok := m.AckID.(*delivery)
	if !ok || d == nil {
		return nil, fmt.Errorf("nats: message %q was not received by this driver", m.ID)
	}
	return d, nil
}

// settle ends d's delivery. Called with s.mu held.
func (s *subscriptionDriver) settle(d *delivery) error {
	if d.settled {
		return nil
	}
	d.settled = true
	delete(s.live, d)
	d.p.live--
	select {
	case d.p.wake <- struct{}{}:
	default:
	}
	close(s.settled)
	s.settled = make(chan struct{})
	if d.lost {
		return errLost
	}
	return nil
}

// Ack acknowledges ms.
func (s *subscriptionDriver) Ack(ctx context.Context, ms []*driver.Message) error {
	var first error
	for _, m := range ms {
		d, err := deliveryOf(m)
		if err == nil {
			s.mu.Lock()
			err = s.settle(d)
			if err == nil {
				s.clearRun(d)
			}
			s.mu.Unlock()
		}
		if err == nil {
			err = d.in.msg.Ack()
		}
		if err != nil && first == nil {
			first = fmt.Errorf("nats: ack %q: %w", m.ID, err)
		}
	}
	return first
}

// Nack gives m back counted (its runs recorded first); the subscribe
// package never calls it (no native hold).
func (s *subscriptionDriver) Nack(ctx context.Context, m *driver.Message, delay time.Duration) error {
	d, err := deliveryOf(m)
	if err != nil {
		return err
	}
	if err := s.record(ctx, d); err != nil {
		return err
	}
	s.mu.Lock()
	err = s.settle(d)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return d.in.msg.NakWithDelay(delay)
}

// Release gives ms back: the server redelivers them at once (Nak). A
// message that never started has no record and comes back as the attempt
// it was; one that started is recorded first.
func (s *subscriptionDriver) Release(ctx context.Context, ms []*driver.Message) error {
	byPart := map[*part][]*delivery{}
	s.mu.Lock()
	for _, m := range ms {
		d, err := deliveryOf(m)
		if err != nil {
			s.mu.Unlock()
			return err
		}
		if d.settled {
			continue
		}
		_ = s.settle(d)
		if !d.lost {
			byPart[d.p] = append(byPart[d.p], d)
		}
	}
	s.mu.Unlock()
	for _, ds := range byPart {
		s.giveBack(ctx, ds)
	}
	return nil
}

// giveBack naks ds in stream order, after recording the runs of those
// that started.
func (s *subscriptionDriver) giveBack(ctx context.Context, ds []*delivery) {
	for _, d := range ds {
		if d.started.Load() {
			if err := s.record(ctx, d); err != nil {
				s.opts.Logger.Warn("keyorder: nats: recording the runs of a message given back", "subscription", s.sub, "err", err)
			}
		}
	}
	slices.SortFunc(ds, func(a, b *delivery) int {
		return cmp.Compare(a.in.meta.Sequence.Stream, b.in.meta.Sequence.Stream)
	})
	for _, d := range ds {
		_ = d.in.msg.Nak()
	}
}

// ExtendLeases renews the leases of ms (InProgress) and returns those
// whose partition is no longer this process's.
func (s *subscriptionDriver) ExtendLeases(ctx context.Context, ms []*driver.Message) ([]*driver.Message, error) {
	now := time.Now()
	var lost []*driver.Message
	var renew []jetstream.Msg
	s.mu.Lock()
	for _, m := range ms {
		d, err := deliveryOf(m)
		if err != nil {
			s.mu.Unlock()
			return lost, err
		}
		if d.lost || d.p.revoking && now.After(d.p.until) {
			lost = append(lost, m)
			continue
		}
		d.deadline = now.Add(s.opts.Lease)
		renew = append(renew, d.in.msg)
	}
	s.mu.Unlock()
	for _, m := range renew {
		_ = m.InProgress()
	}
	return lost, nil
}

// release stops consuming p: no more hand-outs, the fetcher stopped, the
// portable layer's revocation run (graceful: waiting for the messages in
// flight up to RevokeTimeout and their leases), then everything still held
// given back (unrun ones uncounted) and the ownership entry deleted.
func (s *subscriptionDriver) release(p *part, graceful bool) {
	s.mu.Lock()
	if p.revoking {
		s.mu.Unlock()
		return
	}
	p.revoking = true
	revoke := s.revoke
	s.mu.Unlock()
	close(p.stop)
	<-p.done
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.RevokeTimeout)
	defer cancel()
	if !graceful {
		rctx, rcancel := context.WithTimeout(ctx, s.tick())
		defer rcancel()
		ctx = rctx
	}
	var forgotten []*delivery
	if revoke != nil {
		var still map[*delivery]bool
		selected := func(m *driver.Message) bool {
			d, ok := m.AckID.(*delivery)
			return ok && d.p == p
		}
		running := revoke(ctx, selected)
		still = map[*delivery]bool{}
		for _, m := range running {
			if d, ok := m.AckID.(*delivery); ok {
				still[d] = true
			}
		}
		s.mu.Lock()
		for d := range s.live {
			if d.p == p && !still[d] {
				forgotten = append(forgotten, d)
			}
		}
		s.mu.Unlock()
	}
	// Wait for what runs to settle, no longer than ctx and its lease.
	for {
		s.mu.Lock()
		waiting := false
		now := time.Now()
		for d := range s.live {
			if d.p == p && !slicesContains(forgotten, d) && now.Before(d.deadline) && graceful {
				waiting = true
			}
		}
		ch := s.settled
		s.mu.Unlock()
		if !waiting {
			break
		}
		select {
		case <-ch:
		case <-ctx.Done():
		case <-time.After(s.tick()):
		}
		if ctx.Err() != nil {
			break
		}
	}
	var back []*delivery
	s.mu.Lock()
	for _, in := range p.backlog {
		back = append(back, &delivery{p: p, in: in})
	}
	p.backlog = nil
	for d := range s.live {
		if d.p != p {
			continue
		}
		d.lost = true
		d.settled = true
		delete(s.live, d)
		back = append(back, d)
	}
	rev := p.rev
	s.mu.Unlock()
	gctx, gcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer gcancel()
	s.giveBack(gctx, back)
	_ = s.leases.Delete(gctx, partKey(p.n), jetstream.LastRevision(rev))
	s.mu.Lock()
	if s.parts[p.n] == p {
		delete(s.parts, p.n)
	}
	close(s.settled)
	s.settled = make(chan struct{})
	s.mu.Unlock()
}

func slicesContains(ds []*delivery, d *delivery) bool {
	for _, x := range ds {
		if x == d {
			return true
		}
	}
	return false
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
