package postgres

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// store is what Admin, Topic and Subscription share: the pool and the
// schema-qualified query text.
type store struct {
	pool   *pgxpool.Pool
	schema string
	q      string // quoted schema
}

func newStore(pool *pgxpool.Pool, schema string) *store {
	return &store{pool: pool, schema: schema, q: pgx.Identifier{schema}.Sanitize()}
}

func (s *store) sql(tmpl string) string { return expand(tmpl, s.q) }

// channel is the LISTEN/NOTIFY channel of a topic: a digest, because a
// channel name is limited to 63 bytes and schema and topic are free text.
func (s *store) channel(topic string) string {
	h := sha256.Sum256([]byte(s.schema + "\x00" + topic))
	return "keyorder_" + hex.EncodeToString(h[:12])
}

// Admin manages topics and subscriptions in one schema.
type Admin struct{ s *store }

// NewAdmin returns an Admin for the schema of opts (nil: SchemaDefault).
func NewAdmin(pool *pgxpool.Pool, opts *Options) (*Admin, error) {
	o := opts.WithDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	return &Admin{s: newStore(pool, o.Schema)}, nil
}

// CreateTopic creates the topic if it does not exist.
func (a *Admin) CreateTopic(ctx context.Context, topic string) error {
	_, err := a.s.createTopic(ctx, topic)
	return err
}

func (s *store) createTopic(ctx context.Context, topic string) (int32, error) {
	if topic == "" {
		return 0, fmt.Errorf("%w: postgres: empty topic name", keyorder.ErrInvalidConfig)
	}
	var id int32
	err := s.pool.QueryRow(ctx, s.sql(`
		WITH i AS (INSERT INTO {{schema}}.topics (name) VALUES ($1) ON CONFLICT (name) DO NOTHING RETURNING id)
		SELECT id FROM i UNION ALL SELECT id FROM {{schema}}.topics WHERE name = $1`), topic).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("postgres: create topic %q: %w", topic, err)
	}
	return id, nil
}

func (s *store) topicID(ctx context.Context, topic string) (int32, error) {
	var id int32
	err := s.pool.QueryRow(ctx, s.sql(`SELECT id FROM {{schema}}.topics WHERE name = $1`), topic).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("postgres: topic %q: %w", topic, keyorder.ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("postgres: topic %q: %w", topic, err)
	}
	return id, nil
}

// CreateSubscription creates a subscription of topic (creating the topic
// too) if it does not exist. The settings of an existing subscription are
// left as they are; if they differ from opts the call fails with
// keyorder.ErrInvalidConfig, because a subscription's policy cannot change
// under its consumers.
func (a *Admin) CreateSubscription(ctx context.Context, topic, name string, opts *SubscriptionOptions) error {
	_, err := a.s.createSubscription(ctx, topic, name, opts)
	return err
}

func (s *store) createSubscription(ctx context.Context, topic, name string, opts *SubscriptionOptions) (*subInfo, error) {
	o := opts.WithDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	if name == "" {
		return nil, fmt.Errorf("%w: postgres: empty subscription name", keyorder.ErrInvalidConfig)
	}
	tid, err := s.createTopic(ctx, topic)
	if err != nil {
		return nil, err
	}
	_, err = s.pool.Exec(ctx, s.sql(`
		INSERT INTO {{schema}}.subscriptions (topic_id, name, ordering, max_attempts, min_backoff, max_backoff, compact)
		VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (topic_id, name) DO NOTHING`),
		tid, name, storedOrdering(o.Ordering), o.MaxAttempts, o.MinBackoff, o.MaxBackoff, o.Compaction)
	if err != nil {
		return nil, fmt.Errorf("postgres: create subscription %q of %q: %w", name, topic, err)
	}
	info, err := s.subscription(ctx, topic, name)
	if err != nil {
		return nil, err
	}
	if info.opts.conflicts(o) {
		return info, fmt.Errorf("%w: postgres: subscription %q of %q exists with %+v, not %+v", keyorder.ErrInvalidConfig, name, topic, *info.opts, *o)
	}
	if err := s.ensureCompactIndex(ctx, info); err != nil {
		return nil, fmt.Errorf("postgres: create subscription %q of %q: %w", name, topic, err)
	}
	return info, nil
}

// ensureCompactIndex creates the partial index of a compacting Parallel
// subscription (sqlCompactIndex) if it is missing. Two processes creating
// it at once race on the catalog: the loser's error means it exists.
func (s *store) ensureCompactIndex(ctx context.Context, info *subInfo) error {
	if !info.opts.Compaction || info.opts.Ordering != policy.Parallel {
		return nil
	}
	// CREATE INDEX IF NOT EXISTS locks the table before it finds the index:
	// look first, so reopening with Create does not stall publishers.
	var exists bool
	if err := s.pool.QueryRow(ctx, s.compactSQL(`SELECT to_regclass('{{schema}}.deliveries_compact_{{sub}}') IS NOT NULL`, info.id)).Scan(&exists); err != nil || exists {
		return err
	}
	_, err := s.pool.Exec(ctx, s.compactSQL(sqlCompactIndex, info.id))
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "23505" || pe.Code == "42P07") {
		return nil
	}
	return err
}

// The subscriptions table stores a subscription's ordering as a number
// the SQL reads (0 parallel, 1 exclusive, 2 ordered; migration 003 and
// sqlReady's conditions), independent of policy.Ordering's constants.
const (
	dbParallel  int16 = 0
	dbExclusive int16 = 1
	dbOrdered   int16 = 2
)

// storedOrdering is o as the subscriptions table stores it. o is valid
// (SubscriptionOptions.validate).
func storedOrdering(o policy.Ordering) int16 {
	switch o {
	case policy.Parallel:
		return dbParallel
	case policy.Exclusive:
		return dbExclusive
	}
	return dbOrdered
}

// orderingOf is the ordering the subscriptions table stores as n; an
// unknown number reads as an invalid policy.Ordering, which validation
// refuses.
func orderingOf(n int16) policy.Ordering {
	switch n {
	case dbParallel:
		return policy.Parallel
	case dbExclusive:
		return policy.Exclusive
	case dbOrdered:
		return policy.Ordered
	}
	return policy.Ordering(-1)
}

// subInfo is a subscription's row.
type subInfo struct {
	id, topicID int32
	topic, name string
	opts        *SubscriptionOptions
}

func (s *store) subscription(ctx context.Context, topic, name string) (*subInfo, error) {
	info := &subInfo{topic: topic, name: name, opts: &SubscriptionOptions{}}
	var ordering int16
	err := s.pool.QueryRow(ctx, s.sql(`
		SELECT s.id, s.topic_id, s.ordering, s.max_attempts, s.min_backoff, s.max_backoff, s.compact
		FROM {{schema}}.subscriptions s JOIN {{schema}}.topics t ON t.id = s.topic_id
		WHERE t.name = $1 AND s.name = $2`), topic, name).
		Scan(&info.id, &info.topicID, &ordering, &info.opts.MaxAttempts, &info.opts.MinBackoff, &info.opts.MaxBackoff,
			&info.opts.Compaction)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("postgres: subscription %q of topic %q: %w", name, topic, keyorder.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("postgres: subscription %q of topic %q: %w", name, topic, err)
	}
	info.opts.Ordering = orderingOf(ordering)
	return info, nil
}

// DeleteSubscription deletes a subscription with its pending deliveries,
// heads and dead letters. Deleting one that does not exist is not an error.
func (a *Admin) DeleteSubscription(ctx context.Context, topic, name string) error {
	info, err := a.s.subscription(ctx, topic, name)
	if errors.Is(err, keyorder.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	b.Queue(a.s.compactSQL(`DROP INDEX IF EXISTS {{schema}}.deliveries_compact_{{sub}}`, info.id))
	for _, t := range []string{"deliveries", "heads", "dead_letters", "superseded", "subscriptions"} {
		col := "sub_id"
		if t == "subscriptions" {
			col = "id"
		}
		b.Queue(a.s.sql(`DELETE FROM {{schema}}.`+t+` WHERE `+col+` = $1`), info.id)
	}
	if err := a.s.pool.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("postgres: delete subscription %q of %q: %w", name, topic, err)
	}
	return nil
}

func (s *store) deadLetters(ctx context.Context, subID int32, limit int) ([]driver.DeadLetter, error) {
	rows, err := s.pool.Query(ctx, s.sql(`
		SELECT msg_id, msg_key, payload, headers, published_at, reason, attempts, dead_at
		FROM {{schema}}.dead_letters WHERE sub_id = $1 ORDER BY dead_at, id LIMIT $2`), subID, sqlLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("postgres: dead letters: %w", err)
	}
	var out []driver.DeadLetter
	for rows.Next() {
		var dl driver.DeadLetter
		var key *string
		var headers []byte
		if err := rows.Scan(&dl.Message.ID, &key, &dl.Message.Payload, &headers, &dl.Message.PublishTime, &dl.Reason, &dl.Attempts, &dl.DeadAt); err != nil {
			rows.Close()
			return nil, fmt.Errorf("postgres: dead letters: %w", err)
		}
		if key != nil {
			dl.Message.Key = *key
		}
		if dl.Message.Headers, err = decodeHeaders(headers); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, dl)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("postgres: dead letters: %w", err)
	}
	return out, nil
}

// sqlRedrive takes the dead letters to redrive out of the table. The ids
// go through ARRAY(SELECT unnest(...)) as in sqlAck, so that each is looked
// up in dead_letters_msg_id: given 1,000 of them as an array the planner
// read every dead letter of the subscription (all of the table, with
// statistics) to find them (TestArrayPlansLookUpKeys).
const sqlRedrive = `
DELETE FROM {{schema}}.dead_letters WHERE sub_id = $1 AND msg_id = ANY(ARRAY(SELECT unnest($2::text[])))
RETURNING id, msg_id, coalesce(msg_key, ''), payload, headers::text, published_at`

func (s *store) redrive(ctx context.Context, info *subInfo, ids []string) (int, error) {
	var n int
	var done []string // the IDs redriven
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.sql(sqlRedrive), info.id, ids)
		if err != nil {
			return err
		}
		type dead struct {
			id int64
			m  driver.Message
			h  *string
		}
		var ds []dead
		for rows.Next() {
			var d dead
			if err := rows.Scan(&d.id, &d.m.ID, &d.m.Key, &d.m.Payload, &d.h, &d.m.PublishTime); err != nil {
				rows.Close()
				return err
			}
			ds = append(ds, d)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		// Redrive in the order they were first published.
		slices.SortFunc(ds, func(a, b dead) int { return cmp.Compare(a.id, b.id) })
		ms := make([]*driver.Message, len(ds))
		for i := range ds {
			m := ds[i].m
			if ds[i].h != nil {
				if err := json.Unmarshal([]byte(*ds[i].h), &m.Headers); err != nil {
					return err
				}
			}
			ms[i] = &m
		}
		n = len(ms)
		for _, m := range ms {
			done = append(done, m.ID)
		}
		if n == 0 {
			return nil
		}
		return s.insert(ctx, tx, info.topicID, &info.id, ms, "")
	})
	if err != nil {
		return 0, fmt.Errorf("postgres: redrive: %w", err)
	}
	return n, driver.NotDeadLetters(ids, done)
}

func (s *store) heldKeys(ctx context.Context, subID int32, limit int) ([]keyorder.HeldKey, error) {
	rows, err := s.pool.Query(ctx, s.sql(`
		SELECT msg_key, lease_token IS NOT NULL, claimable_at FROM {{schema}}.heads
		WHERE sub_id = $1 AND claimable_at > now() AND claimable_at < 'infinity'
		ORDER BY claimable_at LIMIT $2`), subID, sqlLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("postgres: held keys: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (keyorder.HeldKey, error) {
		var k keyorder.HeldKey
		err := r.Scan(&k.Key, &k.InFlight, &k.Until)
		return k, err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: held keys: %w", err)
	}
	return out, nil
}

// Purge deletes the bodies of a topic's messages that no subscription
// needs any more, in chunks, and returns how many it deleted. Acks delete
// them as they go; Purge collects what races between subscriptions and
// publishes to a topic with no subscription leave behind.
func (a *Admin) Purge(ctx context.Context, topic string) (int64, error) {
	tid, err := a.s.topicID(ctx, topic)
	if err != nil {
		return 0, err
	}
	var total int64
	var after int64
	for {
		var deleted, last int64
		var scanned int
		err := a.s.pool.QueryRow(ctx, a.s.sql(`
			WITH c AS (SELECT id FROM {{schema}}.messages WHERE topic_id = $1 AND id > $2 ORDER BY id LIMIT 5000),
			d AS (DELETE FROM {{schema}}.messages m USING c WHERE m.id = c.id
			      AND NOT EXISTS (SELECT 1 FROM {{schema}}.deliveries x
			          WHERE x.sub_id IN (SELECT id FROM {{schema}}.subscriptions WHERE topic_id = $1) AND x.id = m.id)
			      RETURNING 1)
			SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM c)::int, coalesce((SELECT max(id) FROM c), 0)`),
			tid, after).Scan(&deleted, &scanned, &last)
		if err != nil {
			return total, fmt.Errorf("postgres: purge %q: %w", topic, err)
		}
		total += deleted
		if scanned < 5000 {
			return total, nil
		}
		after = last
	}
}

// backendStats counts what the subscription keeps (a full count: for
// monitoring and tests, not for a hot path).
func (s *store) backendStats(ctx context.Context, subID int32) (keyorder.BackendStats, error) {
	var st keyorder.BackendStats
	err := s.pool.QueryRow(ctx, s.sql(`SELECT
		(SELECT count(*) FROM {{schema}}.deliveries WHERE sub_id = $1),
		(SELECT count(*) FROM {{schema}}.dead_letters WHERE sub_id = $1),
		(SELECT count(*) FROM {{schema}}.heads WHERE sub_id = $1),
		(SELECT count(*) FROM {{schema}}.heads WHERE sub_id = $1 AND claimable_at > now() AND claimable_at < 'infinity'),
		(`+sqlSuperseded+`)`), subID).
		Scan(&st.Pending, &st.Dead, &st.Keys, &st.HeldKeys, &st.Superseded)
	if err != nil {
		return keyorder.BackendStats{}, fmt.Errorf("postgres: stats: %w", err)
	}
	return st, nil
}

// StoredMessages counts the message bodies a topic stores. Acknowledgements
// delete the bodies no subscription needs any more, and Purge collects the
// rest; this count is how to watch that retention (the counts of one
// subscription are subscribe.Subscriber.Stats).
func (a *Admin) StoredMessages(ctx context.Context, topic string) (int64, error) {
	tid, err := a.s.topicID(ctx, topic)
	if err != nil {
		return 0, err
	}
	var n int64
	if err := a.s.pool.QueryRow(ctx, a.s.sql(`SELECT count(*) FROM {{schema}}.messages WHERE topic_id = $1`), tid).Scan(&n); err != nil {
		return 0, fmt.Errorf("postgres: stored messages of %q: %w", topic, err)
	}
	return n, nil
}

// execer is what a publish runs on: a pool, a connection or a transaction.
type execer interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func decodeHeaders(b []byte) (map[string]string, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var h map[string]string
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("postgres: decode headers: %w", err)
	}
	return h, nil
}

// sqlLimit turns a listing limit into a LIMIT argument: limit <= 0 means
// no limit (LIMIT NULL), as driver.DeadLetterStore defines it.
func sqlLimit(limit int) any {
	if limit <= 0 {
		return nil
	}
	return limit
}
