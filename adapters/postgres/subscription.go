package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// pgSubscription is the subscription driver: it consumes one subscription.
// It implements driver.Subscription, DeadLetterStore, StatsReporter and
// HeldKeyLister.
type pgSubscription struct {
	s        *store
	info     *subInfo
	opts     *Options
	ownsPool bool

	claimKeys, claimDirect string // expanded claim queries
	nackDirect             string
	compact                bool // SubscriptionOptions.Compaction (sql_compact.go)
	release                string
	lease                  time.Duration

	starts starts // marks of started handlers (started.go)

	wake     chan struct{}
	listener *listener
	closed   atomic.Bool
	done     chan struct{}
	maint    sync.WaitGroup
}

var (
	_ driver.Subscription    = (*pgSubscription)(nil)
	_ driver.DeadLetterStore = (*pgSubscription)(nil)
	_ driver.StatsReporter   = (*pgSubscription)(nil)
	_ driver.HeldKeyLister   = (*pgSubscription)(nil)
	_ driver.StartRecorder   = (*pgSubscription)(nil)
	_ driver.Returner        = (*pgSubscription)(nil)
)

// ackID is a delivery's handle. A keyed delivery belongs to the chain it
// was claimed in; the chain's head lease is released when its last member is
// settled.
type ackID struct {
	id    int64
	token int64
	chain *chain // nil for a direct delivery
	// suspect: a lease of this delivery was lost before with it maybe
	// running unmarked (deliveries.unstarted > 0); Started writes its mark
	// before returning (see started.go).
	suspect bool
	// su is the subscription that claimed it (CompleteTx finds it here).
	su *pgSubscription
	// committed: completed in a transaction that committed (HandleTx), so
	// Ack has only the key to release.
	committed atomic.Bool
}

type chain struct {
	key   string
	token int64

	mu        sync.Mutex
	started   int64 // the highest id Started was called with (started.go)
	unsettled map[int64]struct{}
	running   int // settling calls whose transaction has not ended
	released  bool
}

// begin removes ids from the chain as a settling call starts. It reports
// whether this call empties the chain while no other call is in flight: the
// call then releases the head in its own transaction.
func (c *chain) begin(ids []int64) (piggyback bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		delete(c.unsettled, id)
	}
	c.running++
	if len(c.unsettled) == 0 && c.running == 1 && !c.released {
		c.released = true
		return true
	}
	return false
}

// end records that a settling call's transaction ended. A failed call puts
// its ids back. It reports whether the head must now be released by a
// transaction of its own: the chain is empty and this was the last call in
// flight. The head is never released before every member's settlement has
// committed, or a claimer could see a member that is being acked or
// dead-lettered and deliver it again.
func (c *chain) end(ids []int64, ok, piggyback bool) (releaseNow bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.running--
	if !ok {
		for _, id := range ids {
			c.unsettled[id] = struct{}{}
		}
		if piggyback {
			c.released = false
		}
		return false
	}
	if len(c.unsettled) == 0 && c.running == 0 && !c.released {
		c.released = true
		return true
	}
	return false
}

// openSubscription opens the driver of subscription sub of topic on pool. With
// opts.Migrate it first applies pending migrations; with opts.Create it
// creates the topic and subscription (with opts.Subscription) if missing,
// else a missing one fails with keyorder.ErrNotFound. The pool stays the
// caller's: Close does not close it. A subscription holds one extra
// connection outside the pool for LISTEN.
func openSubscription(ctx context.Context, pool *pgxpool.Pool, topic, sub string, opts *Options) (*pgSubscription, error) {
	o := opts.WithDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	s := newStore(pool, o.Schema)
	if o.Migrate {
		if _, err := Migrate(ctx, pool, DirectionUp, &MigrateOptions{Schema: o.Schema}); err != nil {
			return nil, err
		}
	}
	var info *subInfo
	var err error
	if o.Create {
		info, err = s.createSubscription(ctx, topic, sub, o.Subscription)
	} else {
		info, err = s.subscription(ctx, topic, sub)
	}
	if err != nil {
		return nil, err
	}
	next := nextOrdered
	if info.opts.Ordering == policy.Exclusive {
		next = nextExclusive
	}
	su := &pgSubscription{
		s: s, info: info, opts: o,
		claimKeys:   s.sql(sqlClaimKeys),
		claimDirect: s.sql(sqlClaimDirect),
		nackDirect:  s.sql(sqlNackDirect),
		release:     s.sql(strings.ReplaceAll(sqlRelease, "{{next}}", next)),
		lease:       o.Lease,
		wake:        make(chan struct{}, 1),
		done:        make(chan struct{}),
	}
	if info.opts.Compaction {
		su.compact = true
		su.claimKeys = s.sql(sqlClaimKeysCompact)
		su.claimDirect = s.compactSQL(sqlClaimDirectCompact, info.id)
		su.nackDirect = s.compactSQL(sqlNackDirectCompact, info.id)
	}
	su.listener = startListener(pool, s.channel(topic), su.wake, su.done, o.Logger)
	if info.opts.Ordering.Keyed() {
		su.starts.init()
		su.maint.Add(1)
		go su.startsLoop()
	}
	if info.opts.Ordering.Keyed() && o.VacuumInterval > 0 {
		su.maint.Add(1)
		go su.vacuumLoop()
	}
	return su, nil
}

// Name returns the subscription's name.
func (su *pgSubscription) Name() string { return su.info.name }

// AcksFinal implements driver.FinalAcker: true. An Ack deletes the
// deliveries it settles in its transaction, and one from a consumer whose
// lease was lost fails (ErrLeaseLost), so a message whose Ack returned nil
// is never claimed again.
func (su *pgSubscription) AcksFinal() bool { return true }

// Settings returns the subscription's settings, as fixed at creation.
func (su *pgSubscription) Settings() SubscriptionOptions { return *su.info.opts }

// Capabilities describes the subscription: the database holds groups
// itself (NativeHold), and the retry settings stored with the subscription
// are the ones consumers run (Retry).
func (su *pgSubscription) Capabilities() driver.Capabilities {
	return driver.Capabilities{
		Ordering:      su.info.opts.Ordering,
		NativeHold:    true,
		LeaseDuration: su.lease,
		MaxBatch:      su.opts.MaxBatch,
		Retry:         new(su.info.opts.Retry()),
	}
}

// Receive claims up to maxMessages: chains of up to ChainLength consecutive
// messages per key (Exclusive, Ordered), and single messages (Parallel,
// keyless). It waits for a notification, the next retry or delay to fall due,
// or PollInterval, whichever comes first, while nothing is claimable.
func (su *pgSubscription) Receive(ctx context.Context, maxMessages int) ([]*driver.Message, error) {
	maxMessages = min(max(maxMessages, 1), su.opts.MaxBatch)
	for {
		if su.closed.Load() {
			return nil, keyorder.ErrClosed
		}
		// The claim itself is not interrupted by ctx: a claim that committed
		// but whose answer was dropped would leave its keys leased to no one
		// until the lease expired. It is bounded by the lease instead.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), su.lease)
		ms, wait, err := su.claim(cctx, maxMessages)
		cancel()
		if err != nil || len(ms) > 0 {
			if err != nil && ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return ms, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-su.done:
			t.Stop()
			return nil, keyorder.ErrClosed
		case <-su.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// claim runs the claim queries in one round trip. When nothing was claimed it
// also returns how long to wait before trying again.
func (su *pgSubscription) claim(ctx context.Context, maxMessages int) ([]*driver.Message, time.Duration, error) {
	token := rand.Int64()
	keyed := su.info.opts.Ordering.Keyed()
	b := &pgx.Batch{}
	switch {
	case keyed && su.compact: // one message per key
		b.Queue(su.claimKeys, su.info.id, su.info.topicID, maxMessages, su.lease, token)
	case keyed:
		chainLen := min(su.opts.ChainLength, maxMessages)
		b.Queue(su.claimKeys, su.info.id, maxMessages/chainLen, chainLen, su.lease, token,
			su.info.opts.Ordering == policy.Ordered)
	}
	if su.compact {
		b.Queue(su.claimDirect, su.info.id, maxMessages, su.lease, token, su.info.topicID)
	} else {
		b.Queue(su.claimDirect, su.info.id, maxMessages, su.lease, token)
	}
	b.Queue(su.s.sql(sqlNextWake), su.info.id)
	br := su.s.pool.SendBatch(ctx, b)
	defer br.Close()

	var out []*driver.Message
	chains := map[string]*chain{}
	scan := func(direct bool) error {
		rows, err := br.Query()
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			m := &driver.Message{}
			var id int64
			var key *string
			var headers []byte
			var notBefore *time.Time
			var suspect bool // keyed claims only
			if direct {
				err = rows.Scan(&id, &m.ID, &key, &m.Payload, &headers, &notBefore, &m.PublishTime, &m.Attempt)
			} else {
				err = rows.Scan(&id, &m.ID, &key, &m.Payload, &headers, &notBefore, &m.PublishTime, &m.Attempt, &suspect)
			}
			if err != nil {
				return err
			}
			if key != nil {
				m.Key = *key
			}
			if notBefore != nil {
				m.NotBefore = *notBefore
			}
			if m.Headers, err = decodeHeaders(headers); err != nil {
				return err
			}
			a := &ackID{id: id, token: token, suspect: suspect, su: su}
			if !direct {
				c := chains[m.Key]
				if c == nil {
					c = &chain{key: m.Key, token: token, unsettled: map[int64]struct{}{}}
					chains[m.Key] = c
				}
				c.unsettled[id] = struct{}{}
				a.chain = c
			}
			m.AckID = a
			m.Copy = id // a redrive inserts a new row
			out = append(out, m)
		}
		return rows.Err()
	}
	if keyed {
		if err := scan(false); err != nil {
			return nil, 0, fmt.Errorf("postgres: claim: %w", err)
		}
	}
	if err := scan(true); err != nil {
		return nil, 0, fmt.Errorf("postgres: claim: %w", err)
	}
	var secs *float64
	if err := br.QueryRow().Scan(&secs); err != nil {
		return nil, 0, fmt.Errorf("postgres: claim: %w", err)
	}
	if len(out) > 0 {
		// Chains in the order of their first message, keyless messages in
		// between by id: the oldest deliverable first.
		first := map[string]int64{}
		for _, m := range out {
			if a := m.AckID.(*ackID); a.chain != nil {
				if f, ok := first[m.Key]; !ok || a.id < f {
					first[m.Key] = a.id
				}
			}
		}
		rank := func(m *driver.Message) (int64, int64) {
			a := m.AckID.(*ackID)
			if a.chain != nil {
				return first[m.Key], a.id
			}
			return a.id, a.id
		}
		slices.SortStableFunc(out, func(x, y *driver.Message) int {
			x1, x2 := rank(x)
			y1, y2 := rank(y)
			if x1 != y1 {
				return cmp.Compare(x1, y1)
			}
			return cmp.Compare(x2, y2)
		})
		if len(out) > maxMessages {
			// Chains and keyless messages were claimed side by side, each up
			// to maxMessages; keep the oldest and give the rest back.
			excess := out[maxMessages:]
			out = out[:maxMessages]
			if err := su.Release(ctx, excess); err != nil {
				su.opts.Logger.Warn("keyorder postgres: giving back excess claims failed; they wait for lease expiry",
					"subscription", su.info.name, "messages", len(excess), "err", err)
			}
		}
		return out, 0, nil
	}
	wait := su.opts.PollInterval
	if secs != nil {
		d := time.Duration(*secs*float64(time.Second)) + time.Millisecond
		wait = min(max(d, time.Millisecond), wait)
	}
	return nil, wait, nil
}

func ackIDs(ms []*driver.Message) ([]*ackID, error) {
	out := make([]*ackID, len(ms))
	for i, m := range ms {
		a, ok := m.AckID.(*ackID)
		if !ok {
			return nil, fmt.Errorf("%w: postgres: message %q was not received from this driver", keyorder.ErrInvalidConfig, m.ID)
		}
		out[i] = a
	}
	return out, nil
}

// settlement tracks, for one settling call, the chains it touches and the
// heads it releases in its own transaction.
type settlement struct {
	byChain   map[*chain][]int64
	piggyback map[*chain]bool
}

func newSettlement(as []*ackID) *settlement {
	st := &settlement{byChain: map[*chain][]int64{}, piggyback: map[*chain]bool{}}
	for _, a := range as {
		if a.chain != nil {
			st.byChain[a.chain] = append(st.byChain[a.chain], a.id)
		}
	}
	for c, ids := range st.byChain {
		st.piggyback[c] = c.begin(ids)
	}
	return st
}

// end closes the settlement and returns the chains whose heads are now to
// be released in a transaction of their own.
func (st *settlement) end(ok bool) []*chain {
	var out []*chain
	for c, ids := range st.byChain {
		if c.end(ids, ok, st.piggyback[c]) {
			out = append(out, c)
		}
	}
	return out
}

// queueRelease adds the release of the chains' heads to b.
func (su *pgSubscription) queueRelease(b *pgx.Batch, chains []*chain) {
	if len(chains) == 0 {
		return
	}
	slices.SortFunc(chains, func(x, y *chain) int { return strings.Compare(x.key, y.key) })
	keys := make([]string, len(chains))
	tokens := make([]int64, len(chains))
	for i, c := range chains {
		keys[i], tokens[i] = c.key, c.token
	}
	b.Queue(su.s.sql(sqlLockRelease), su.info.id, keys)
	b.Queue(su.release, su.info.id, keys, tokens)
	b.Queue(su.s.sql(sqlDropIdleHeads), su.info.id, keys)
}

// run sends b (several statements run as one implicit transaction) with the
// releases of the chains this call empties, then releases the chains that
// were waiting for it. read, if not nil, reads the results of b's first
// statements (those queued before the call).
func (su *pgSubscription) run(ctx context.Context, op string, b *pgx.Batch, st *settlement, read func(pgx.BatchResults) error) error {
	var piggy []*chain
	for c, p := range st.piggyback {
		if p {
			piggy = append(piggy, c)
		}
	}
	su.queueRelease(b, piggy)
	var err error
	if b.Len() > 0 { // a keyed Release that does not end its chain writes nothing
		br := su.s.pool.SendBatch(ctx, b)
		if read != nil {
			err = read(br)
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}
	later := st.end(err == nil)
	if len(later) > 0 {
		rb := &pgx.Batch{}
		su.queueRelease(rb, later)
		if rerr := su.s.pool.SendBatch(ctx, rb).Close(); rerr != nil {
			// The heads stay leased until their leases expire.
			su.opts.Logger.Warn("keyorder postgres: releasing keys failed; they wait for lease expiry",
				"subscription", su.info.name, "keys", len(later), "err", rerr)
		}
	}
	if err != nil {
		return fmt.Errorf("postgres: %s: %w", op, err)
	}
	if len(piggy) > 0 || len(later) > 0 || op == "release" {
		// Something became claimable: a Receive of this process waiting
		// for a notification or its poll interval tries again now.
		signal(su.wake)
	}
	return nil
}

// Ack deletes the deliveries, and the message bodies no other subscription
// needs, and releases the keys whose chain is now settled. Deliveries
// completed in a committed transaction (HandleTx) are deleted already: for
// them only the keys are released, and with no key to release the call
// writes nothing. A delivery whose lease was lost (another consumer claimed
// it, and may be running it) is left alone: the call acknowledges the
// others and returns an error wrapping ErrLeaseLost naming it.
func (su *pgSubscription) Ack(ctx context.Context, ms []*driver.Message) error {
	as, err := ackIDs(ms)
	if err != nil || len(as) == 0 {
		return err
	}
	var kids, ktokens, dids, dtokens []int64
	var keys []string
	byID := map[int64]string{}
	for i, a := range as {
		if a.committed.Load() {
			continue
		}
		if a.chain != nil {
			kids, keys, ktokens = append(kids, a.id), append(keys, a.chain.key), append(ktokens, a.chain.token)
		} else {
			dids, dtokens = append(dids, a.id), append(dtokens, a.token)
		}
		byID[a.id] = ms[i].ID
	}
	st := newSettlement(as)
	b := &pgx.Batch{}
	var lost []string
	var read func(pgx.BatchResults) error
	queued := 0
	if len(kids) > 0 {
		b.Queue(su.s.sql(sqlAckKeyed), su.info.id, kids, su.info.topicID, keys, ktokens)
		queued++
	}
	if len(dids) > 0 {
		b.Queue(su.s.sql(sqlAck), su.info.id, dids, su.info.topicID, dtokens)
		queued++
	}
	if queued > 0 {
		read = func(br pgx.BatchResults) error {
			for range queued {
				rows, err := br.Query()
				if err != nil {
					return err
				}
				ls, err := pgx.CollectRows(rows, pgx.RowTo[int64])
				if err != nil {
					return err
				}
				for _, id := range ls {
					lost = append(lost, byID[id])
				}
			}
			return nil
		}
	}
	if err := su.run(ctx, "ack", b, st, read); err != nil {
		return err
	}
	if len(lost) > 0 {
		slices.Sort(lost)
		return fmt.Errorf("postgres: ack: %w: %d of %d messages (%s)", ErrLeaseLost, len(lost), len(byID), strings.Join(lost, ", "))
	}
	return nil
}

// Nack records the failed attempt and makes m
// claimable again not before delay. Under Ordered its key stays held until
// then: nothing behind m is claimed.
func (su *pgSubscription) Nack(ctx context.Context, m *driver.Message, delay time.Duration) error {
	return su.nack(ctx, m, delay, m.Attempt, false)
}

// nack is Nack writing attempts as the attempts m used; a direct delivery
// (counted when claimed) has them written only when set is true (Return).
func (su *pgSubscription) nack(ctx context.Context, m *driver.Message, delay time.Duration, attempts int, set bool) error {
	as, err := ackIDs([]*driver.Message{m})
	if err != nil {
		return err
	}
	a := as[0]
	st := newSettlement(as)
	b := &pgx.Batch{}
	if a.chain != nil {
		b.Queue(su.s.sql(sqlNackKeyed), su.info.id, a.id, max(delay, 0), attempts, a.token)
	} else {
		if set {
			b.Queue(su.s.sql(sqlSetAttemptsDirect), su.info.id, a.id, attempts, a.token)
		}
		args := []any{su.info.id, a.id, max(delay, 0), a.token}
		if su.compact {
			args = append(args, su.info.topicID)
		}
		b.Queue(su.nackDirect, args...)
	}
	return su.run(ctx, "nack", b, st, nil)
}

// Return gives back messages that ran and wait for a retry
// (driver.Returner): each is nacked as Nack does, with the attempts it
// used (its next delivery is attempt Attempts+1) and claimable again not
// before its NotBefore, so a graceful stop keeps both the count and the
// remaining delay. Under Ordered the key stays held until then.
func (su *pgSubscription) Return(ctx context.Context, rs []driver.Returned) error {
	var errs []error
	for _, r := range rs {
		if err := su.nack(ctx, r.Message, max(time.Until(r.NotBefore), 0), r.Attempts, true); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Release gives ms back without counting an attempt; they keep their place.
func (su *pgSubscription) Release(ctx context.Context, ms []*driver.Message) error {
	as, err := ackIDs(ms)
	if err != nil || len(as) == 0 {
		return err
	}
	var direct, tokens []int64
	for _, a := range as {
		if a.chain == nil {
			direct = append(direct, a.id)
			tokens = append(tokens, a.token)
		}
	}
	st := newSettlement(as)
	b := &pgx.Batch{}
	if len(direct) > 0 {
		b.Queue(su.s.sql(sqlReleaseDirect), su.info.id, direct, tokens)
	}
	return su.run(ctx, "release", b, st, nil)
}

// DeadLetter moves m to the dead letters with reason and attempts; its key
// continues with the next message. If m's lease was lost (another consumer
// claimed it, and may be running it), nothing is written and the error
// wraps ErrLeaseLost.
func (su *pgSubscription) DeadLetter(ctx context.Context, m *driver.Message, reason string, attempts int) error {
	as, err := ackIDs([]*driver.Message{m})
	if err != nil {
		return err
	}
	a := as[0]
	key, token := "", a.token
	if a.chain != nil {
		key, token = a.chain.key, a.chain.token
	}
	st := newSettlement(as)
	b := &pgx.Batch{}
	b.Queue(su.s.sql(sqlDeadLetter), su.info.id, a.id, reason, attempts, key, token, a.chain == nil)
	held := false
	read := func(br pgx.BatchResults) error { return br.QueryRow().Scan(&held) }
	if err := su.run(ctx, "dead-letter", b, st, read); err != nil {
		return err
	}
	if !held {
		return fmt.Errorf("postgres: dead-letter: %w: message %q", ErrLeaseLost, m.ID)
	}
	return nil
}

// ExtendLeases renews the leases of ms (a keyed message's lease is its
// chain's) and returns those whose lease was lost.
func (su *pgSubscription) ExtendLeases(ctx context.Context, ms []*driver.Message) ([]*driver.Message, error) {
	as, err := ackIDs(ms)
	if err != nil || len(as) == 0 {
		return nil, err
	}
	type ck struct {
		key   string
		token int64
	}
	seen := map[ck]bool{}
	var keys []string
	var ktokens, direct, dtokens []int64
	for _, a := range as {
		if a.chain != nil {
			k := ck{a.chain.key, a.chain.token}
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k.key)
				ktokens = append(ktokens, k.token)
			}
		} else {
			direct = append(direct, a.id)
			dtokens = append(dtokens, a.token)
		}
	}
	alive := map[ck]bool{}
	aliveDirect := map[int64]bool{}
	b := &pgx.Batch{}
	if len(keys) > 0 {
		b.Queue(su.s.sql(sqlExtendKeys), su.info.id, keys, ktokens, su.lease)
	}
	if len(direct) > 0 {
		b.Queue(su.s.sql(sqlExtendDirect), su.info.id, direct, dtokens, su.lease)
	}
	br := su.s.pool.SendBatch(ctx, b)
	if len(keys) > 0 {
		rows, _ := br.Query()
		for rows.Next() {
			var k ck
			if err := rows.Scan(&k.key, &k.token); err != nil {
				break
			}
			alive[k] = true
		}
		if err := rows.Err(); err != nil {
			br.Close()
			return nil, fmt.Errorf("postgres: extend leases: %w", err)
		}
	}
	if len(direct) > 0 {
		rows, _ := br.Query()
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				break
			}
			aliveDirect[id] = true
		}
		if err := rows.Err(); err != nil {
			br.Close()
			return nil, fmt.Errorf("postgres: extend leases: %w", err)
		}
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("postgres: extend leases: %w", err)
	}
	var lost []*driver.Message
	for i, a := range as {
		if a.chain != nil && !alive[ck{a.chain.key, a.chain.token}] || a.chain == nil && !aliveDirect[a.id] {
			lost = append(lost, ms[i])
		}
	}
	return lost, nil
}

// DeadLetters lists up to limit dead letters, oldest first.
func (su *pgSubscription) DeadLetters(ctx context.Context, limit int) ([]driver.DeadLetter, error) {
	return su.s.deadLetters(ctx, su.info.id, limit)
}

// Redrive puts the dead letters with these message IDs back on the
// subscription after everything that arrived meanwhile, with a fresh attempt
// count.
func (su *pgSubscription) Redrive(ctx context.Context, ids []string) (int, error) {
	return su.s.redrive(ctx, su.info, ids)
}

// HeldKeys lists up to limit keys that are in flight or waiting, soonest
// first (driver.HeldKeyLister).
func (su *pgSubscription) HeldKeys(ctx context.Context, limit int) ([]keyorder.HeldKey, error) {
	return su.s.heldKeys(ctx, su.info.id, limit)
}

// BackendStats counts the subscription's pending messages, dead letters,
// keys and held keys (driver.StatsReporter).
func (su *pgSubscription) BackendStats(ctx context.Context) (keyorder.BackendStats, error) {
	return su.s.backendStats(ctx, su.info.id)
}

// IsRetryable reports whether err is transient.
func (su *pgSubscription) IsRetryable(err error) bool { return IsRetryable(err) }

// ErrorCode classifies err.
func (su *pgSubscription) ErrorCode(err error) keyorder.ErrorCode { return ErrorCode(err) }

// Close stops the listener; unsettled messages are left to lease expiry.
// When the Subscription was opened from a URL it closes its pool.
func (su *pgSubscription) Close() error {
	if su.closed.Swap(true) {
		return nil
	}
	close(su.done)
	su.listener.wait()
	su.maint.Wait()
	if su.ownsPool {
		su.s.pool.Close()
	}
	return nil
}

// vacuumLoop vacuums the heads table every VacuumInterval, in one process at
// a time.
func (su *pgSubscription) vacuumLoop() {
	defer su.maint.Done()
	t := time.NewTicker(su.opts.VacuumInterval)
	defer t.Stop()
	warned := false
	for {
		select {
		case <-su.done:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), su.opts.VacuumInterval)
		if err := su.vacuumHeads(ctx); err != nil && !warned && ctx.Err() == nil {
			warned = true
			su.opts.Logger.Warn("keyorder postgres: vacuuming the heads table failed; leaving it to autovacuum",
				"schema", su.s.schema, "err", err)
		}
		cancel()
	}
}

func (su *pgSubscription) vacuumHeads(ctx context.Context) error {
	conn, err := su.s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtext('keyorder.vacuum'), hashtext($1))`, su.s.schema).Scan(&got); err != nil || !got {
		return err
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(hashtext('keyorder.vacuum'), hashtext($1))`, su.s.schema)
	_, err = conn.Exec(ctx, "VACUUM "+su.s.q+".heads")
	return err
}
