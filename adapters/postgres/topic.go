package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/driverkit"
	"github.com/keyorder/keyorder/policy"
)

// Limits of the postgres backend. Keys are btree-indexed text and headers
// jsonb: neither can hold NUL, and jsonb would replace invalid UTF-8, which
// the portable rule (driver.Validate) rejects before anything is stored.
// Bodies are bytea and carry any bytes.
var limits = driver.Limits{
	Backend:          "postgres",
	MaxKeyBytes:      1024,
	KeyUTF8:          true,
	MaxPayloadBytes:  64 << 20,
	MaxBatchMessages: 10000,
	MaxBatchBytes:    64 << 20,
}

// pgTopic is the topic driver: it publishes to one topic. It implements
// driver.Topic.
type pgTopic struct {
	s        *store
	name     string
	id       int32
	opts     *Options
	notifier *notifier
	ownsPool bool
	closed   atomic.Bool
}

var (
	_ driver.Topic          = (*pgTopic)(nil)
	_ driver.MixedKeySender = (*pgTopic)(nil)
)

// openTopic opens the driver of topic on pool. With opts.Migrate it first applies pending
// migrations; with opts.Create it creates the topic if missing, else a
// missing topic fails with keyorder.ErrNotFound. The pool stays the caller's:
// Close does not close it.
func openTopic(ctx context.Context, pool *pgxpool.Pool, topic string, opts *Options) (*pgTopic, error) {
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
	var id int32
	var err error
	if o.Create {
		id, err = s.createTopic(ctx, topic)
	} else {
		id, err = s.topicID(ctx, topic)
	}
	if err != nil {
		return nil, err
	}
	t := &pgTopic{s: s, name: topic, id: id, opts: o}
	if o.NotifyDebounce >= 0 {
		t.notifier = &notifier{s: s, channel: s.channel(topic), debounce: o.NotifyDebounce, log: o.Logger}
	}
	return t, nil
}

// SendBatch inserts ms in one transaction, in order. It accepts a batch
// that mixes keys (see SendsMixedKeys): each key keeps its order within the
// batch.
func (t *pgTopic) SendBatch(ctx context.Context, ms []*driver.Message) error {
	if t.closed.Load() {
		return keyorder.ErrClosed
	}
	if len(ms) == 0 {
		return nil
	}
	for _, m := range ms {
		if err := checkMessage(m); err != nil {
			return err
		}
	}
	return t.s.insert(ctx, t.s.pool, t.id, nil, ms, t.notifyChannel())
}

// SendsMixedKeys reports true: SendBatch inserts a batch of several keys in
// one transaction, all or nothing, each key's messages in order (the head
// locks are taken in key order, so concurrent batches cannot deadlock), so
// the portable publisher combines the keys ready at once into one round
// trip.
func (t *pgTopic) SendsMixedKeys() bool { return true }

// PublishTx enqueues ms inside the caller's transaction: they become
// visible to consumers exactly when tx commits, and vanish if it rolls back
// (the outbox pattern). Messages are validated exactly as
// publish.Publisher validates them (driver.Prepare): an empty ID gets a
// UUIDv7 in the stored row (ms are not modified: choose IDs with
// keyorder.NewID to know them); an empty Key is taken from the
// keyorder.HeaderPartitionKey header; a message with neither is rejected
// with keyorder.ErrMissingKey unless Options.MissingKey is Unordered; a message over a limit fails with a
// *keyorder.LimitError. Nothing is inserted unless every message is valid.
//
// Until tx ends, the heads of the keys it published are locked: consumers
// skip those keys and acknowledgements of them wait. Keep such transactions
// short.
func (t *pgTopic) PublishTx(ctx context.Context, tx pgx.Tx, ms ...*keyorder.Message) error {
	if t.closed.Load() {
		return keyorder.ErrClosed
	}
	dms := make([]*driver.Message, 0, len(ms))
	for _, m := range ms {
		dm, err := driverkit.Prepare(m, "", t.opts.MissingKey != policy.Unordered, limits)
		if err != nil {
			return err
		}
		dms = append(dms, dm)
	}
	if len(dms) == 0 {
		return nil
	}
	return t.s.insert(ctx, tx, t.id, nil, dms, t.notifyChannel())
}

// checkMessage applies the portable validation to a message a caller of
// SendBatch hands in (PublishTx validates through driver.Prepare; a
// redrive re-inserts what was stored, which was valid when it was stored).
func checkMessage(m *driver.Message) error { return driver.Validate(limits, m) }

// notifyChannel returns the channel to NOTIFY inside this publish's
// transaction, or "" when a notification went out less than the debounce
// interval ago (a trailing one is then scheduled).
func (t *pgTopic) notifyChannel() string {
	if t.notifier == nil || !t.notifier.include() {
		return ""
	}
	return t.notifier.channel
}

// insert publishes ms on ex (a pool: its own transaction; a pgx.Tx: the
// caller's). onlySub restricts the deliveries to one subscription
// (redrive).
//
// It is one round trip: a pipeline of the head locks, one statement
// inserting the messages and their deliveries from arrays (unnest), and
// the NOTIFY. Its cost is the server's per-row work, roughly a third each
// for the head locks (a row lock and its WAL record per key), the message
// rows (heap, primary key, identity sequence) and the delivery rows (heap,
// primary key and the per-key index): about 13-15 ms per 1,000 messages
// over 1,000 keys on the 2-core CI machine, where a plain table of (id,
// key, payload) takes 4-6 ms. COPY was tried (2026-12-02, issue 11): it
// cannot return the ids the deliveries need, so the ids are drawn first
// (nextval per row, after the head locks) and the messages and deliveries
// copied in an explicit transaction; that took 22-28 ms per 1,000, the
// extra round trips and the id query costing more than COPY's cheaper heap
// writes saved, and the index inserts are the same.
func (s *store) insert(ctx context.Context, ex execer, topicID int32, onlySub *int32, ms []*driver.Message, notify string) error {
	n := len(ms)
	ids := make([]string, n)
	keys := make([]string, n)
	payloads := make([][]byte, n)
	headers := make([]*string, n)
	notBefore := make([]*time.Time, n)
	var published []*time.Time
	type keyReady struct {
		first, min *time.Time
		anyNow     bool
	}
	heads := map[string]*keyReady{}
	for i, m := range ms {
		ids[i], keys[i], payloads[i] = m.ID, m.Key, m.Payload
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
		if len(m.Headers) > 0 {
			b, err := json.Marshal(m.Headers)
			if err != nil {
				return fmt.Errorf("postgres: encode headers: %w", err)
			}
			h := string(b)
			headers[i] = &h
		}
		var nb *time.Time
		if !m.NotBefore.IsZero() {
			t := m.NotBefore
			nb = &t
		}
		notBefore[i] = nb
		if !m.PublishTime.IsZero() {
			if published == nil {
				published = make([]*time.Time, n)
			}
			t := m.PublishTime
			published[i] = &t
		}
		if m.Key == "" {
			continue
		}
		kr := heads[m.Key]
		if kr == nil {
			kr = &keyReady{first: nb, anyNow: nb == nil}
			heads[m.Key] = kr
		}
		switch {
		case nb == nil:
			kr.anyNow = true
		case kr.min == nil || nb.Before(*kr.min):
			kr.min = nb
		}
	}
	if published == nil {
		published = make([]*time.Time, n)
	}
	b := &pgx.Batch{}
	if len(heads) > 0 {
		hkeys := make([]string, 0, len(heads))
		for k := range heads {
			hkeys = append(hkeys, k)
		}
		slices.Sort(hkeys)
		first := make([]*time.Time, len(hkeys))
		mins := make([]*time.Time, len(hkeys))
		for i, k := range hkeys {
			kr := heads[k]
			first[i] = kr.first
			if !kr.anyNow {
				mins[i] = kr.min
			}
		}
		b.Queue(s.sql(sqlLockHeads), topicID, hkeys, first, mins, onlySub)
	}
	b.Queue(s.sql(sqlInsert), topicID, ids, keys, payloads, headers, notBefore, onlySub, published)
	if notify != "" {
		b.Queue(`SELECT pg_notify($1, '')`, notify)
	}
	if err := ex.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("postgres: publish %d messages: %w", n, err)
	}
	return nil
}

// Limits returns the backend's message limits.
func (t *pgTopic) Limits() driver.Limits { return limits }

// IsRetryable reports whether err is transient.
func (t *pgTopic) IsRetryable(err error) bool { return IsRetryable(err) }

// ErrorCode classifies err.
func (t *pgTopic) ErrorCode(err error) keyorder.ErrorCode { return ErrorCode(err) }

// Close sends a pending trailing notification and, when the Topic was
// opened from a URL, closes its pool.
func (t *pgTopic) Close() error {
	if t.closed.Swap(true) {
		return nil
	}
	if t.notifier != nil {
		t.notifier.flush()
	}
	if t.ownsPool {
		t.s.pool.Close()
	}
	return nil
}

// notifier debounces NOTIFY: NOTIFY serializes committing transactions on a
// global lock, so a Topic sends at most one per debounce interval. A publish
// inside the interval schedules one trailing notification at its end.
type notifier struct {
	s        *store
	channel  string
	debounce time.Duration
	log      *slog.Logger

	mu      sync.Mutex
	last    time.Time
	pending *time.Timer
}

func (n *notifier) include() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := time.Now()
	if since := now.Sub(n.last); since >= n.debounce {
		n.last = now
		return true
	} else if n.pending == nil {
		n.pending = time.AfterFunc(n.debounce-since, n.fire)
	}
	return false
}

func (n *notifier) fire() {
	n.mu.Lock()
	n.pending = nil
	n.last = time.Now()
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := n.s.pool.Exec(ctx, `SELECT pg_notify($1, '')`, n.channel); err != nil {
		// Subscribers poll: a lost notification only delays delivery.
		n.log.Debug("keyorder postgres: trailing notify failed", "channel", n.channel, "err", err)
	}
}

func (n *notifier) flush() {
	n.mu.Lock()
	t := n.pending
	n.pending = nil
	n.mu.Unlock()
	if t != nil && t.Stop() {
		n.fire()
	}
}
