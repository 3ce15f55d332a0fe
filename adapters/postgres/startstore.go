package postgres

// This file: StartStore, a driver.StartStore in PostgreSQL for the drivers
// of brokers that count deliveries rather than runs (SQS, Pub/Sub).

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
)

// StartStoreRetentionDefault is StartStoreOptions.Retention's default:
// SQS's longest message retention, 14 days.
const StartStoreRetentionDefault = 14 * 24 * time.Hour

// StartStoreOptions configures a StartStore. Nil means the defaults.
type StartStoreOptions struct {
	// Schema is the schema migrated with Migrate (migration 005 creates
	// its table, start_runs). Defaults to SchemaDefault.
	Schema string
	// Retention is how long a record no driver deleted (its process died
	// before the message was settled, or the delete failed) is kept after
	// its last write; Expire deletes older ones. Set it to at least the
	// broker's message retention. Defaults to StartStoreRetentionDefault.
	Retention time.Duration
}

// StartStore keeps the start records of other brokers' subscriptions in
// PostgreSQL (driver.StartStore): give it to sqs.Options.StartStore or
// pubsub.SubscriptionOptions.StartStore, the same store to every consumer
// process of a subscription, so that a crash counts an attempt only
// against messages whose handler started.
//
// A record is one row (sub, msg_id, runs) of <schema>.start_runs, written
// only for a message whose handler was still running, or had failed,
// 100 ms after it started (the drivers' record delay), and deleted when the message is
// settled: a consumer whose handlers succeed within that delay costs the
// database nothing but the reads of messages the broker delivered more
// than once. Call Expire now and then (a daily job) to delete what
// crashed processes left behind.
//
// What a failing database does: a driver whose store cannot be read counts
// attempts from the broker's deliveries, as without a store, less one (so
// a message a crash charged unrun still gets its run); a record that
// cannot be written leaves a run uncounted. Nothing is lost or reordered
// either way: the store only moves attempt counts, never a message.
type StartStore struct {
	pool      *pgxpool.Pool
	q         string
	retention time.Duration
}

var _ driver.StartStore = (*StartStore)(nil)

// NewStartStore returns the start store in pool's database, in the schema
// of opts (migrated to version 5 or later by Migrate; NewStartStore does
// not migrate).
func NewStartStore(pool *pgxpool.Pool, opts *StartStoreOptions) (*StartStore, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: postgres.NewStartStore: nil pool", keyorder.ErrInvalidConfig)
	}
	var o StartStoreOptions
	if opts != nil {
		o = *opts
	}
	if o.Schema == "" {
		o.Schema = SchemaDefault
	}
	if !schemaRE.MatchString(o.Schema) {
		return nil, fmt.Errorf("%w: postgres.NewStartStore: schema %q must be a lower-case SQL identifier", keyorder.ErrInvalidConfig, o.Schema)
	}
	if o.Retention < 0 {
		return nil, fmt.Errorf("%w: postgres.NewStartStore: negative Retention %v", keyorder.ErrInvalidConfig, o.Retention)
	}
	if o.Retention == 0 {
		o.Retention = StartStoreRetentionDefault
	}
	return &StartStore{pool: pool, q: pgx.Identifier{o.Schema}.Sanitize(), retention: o.Retention}, nil
}

// Runs implements driver.StartStore.
func (s *StartStore) Runs(ctx context.Context, sub string, ids []string) (map[string]int, error) {
	rows, err := s.pool.Query(ctx, expand(`SELECT msg_id, runs FROM {{schema}}.start_runs WHERE sub = $1 AND msg_id = ANY($2)`, s.q), sub, ids)
	if err != nil {
		return nil, fmt.Errorf("postgres: start store: read runs: %w", err)
	}
	out := make(map[string]int, len(ids))
	var id string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error {
		out[id] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: start store: read runs: %w", err)
	}
	return out, nil
}

// Record implements driver.StartStore. Rows are written in id order, so
// that two processes recording overlapping sets never deadlock.
func (s *StartStore) Record(ctx context.Context, sub string, runs map[string]int) error {
	if len(runs) == 0 {
		return nil
	}
	ids := make([]string, 0, len(runs))
	for id := range runs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	ns := make([]int32, len(ids))
	for i, id := range ids {
		ns[i] = int32(min(runs[id], 1<<30))
	}
	_, err := s.pool.Exec(ctx, expand(`INSERT INTO {{schema}}.start_runs AS r (sub, msg_id, runs)
SELECT $1, u.id, u.n FROM unnest($2::text[], $3::integer[]) AS u(id, n)
ON CONFLICT (sub, msg_id) DO UPDATE SET runs = greatest(r.runs, excluded.runs), updated_at = now()`, s.q), sub, ids, ns)
	if err != nil {
		return fmt.Errorf("postgres: start store: record runs: %w", err)
	}
	return nil
}

// Forget implements driver.StartStore.
func (s *StartStore) Forget(ctx context.Context, sub string, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	ids = slices.Clone(ids)
	slices.Sort(ids)
	_, err := s.pool.Exec(ctx, expand(`DELETE FROM {{schema}}.start_runs WHERE sub = $1 AND msg_id = ANY($2)`, s.q), sub, ids)
	if err != nil {
		return fmt.Errorf("postgres: start store: forget: %w", err)
	}
	return nil
}

// Expire deletes the records last written more than the store's retention
// ago, and returns how many it deleted.
func (s *StartStore) Expire(ctx context.Context) (int64, error) {
	tag, err := s.pool.Exec(ctx, expand(`DELETE FROM {{schema}}.start_runs WHERE updated_at < now() - $1::interval`, s.q), s.retention)
	if err != nil {
		return 0, fmt.Errorf("postgres: start store: expire: %w", err)
	}
	return tag.RowsAffected(), nil
}
