package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// PostgreSQL settings shared by both sides.
const (
	pgBatch     = 1000 // rows per COPY / claim
	pgConsumers = 4    // raw: goroutines claiming rows
)

func postgresBackend(ctx context.Context) (*backend, error) {
	url, err := env("KEYORDER_PG_URL", "postgres")
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, withPoolSize(url, 20))
	if err != nil {
		return nil, err
	}
	schema := fmt.Sprintf("kobench_%d", time.Now().UnixNano()%1e9)
	if _, err := postgres.Migrate(ctx, pool, postgres.DirectionUp, &postgres.MigrateOptions{Schema: schema}); err != nil {
		pool.Close()
		return nil, err
	}
	opts := &postgres.Options{Schema: schema, Create: true, MaxBatch: pgBatch, Logger: quiet(),
		Subscription: &postgres.SubscriptionOptions{Ordering: policy.Ordered}}
	admin, err := postgres.NewAdmin(pool, opts)
	if err != nil {
		pool.Close()
		return nil, err
	}
	f := func(ctx context.Context, id string) (*koDriver, error) {
		// Opening a publisher creates the topic (Options.Create), which
		// the subscription needs.
		t, err := postgres.OpenTopic(ctx, pool, id, opts, nil)
		if err != nil {
			return nil, err
		}
		if err := t.Close(ctx); err != nil {
			return nil, err
		}
		if err := admin.CreateSubscription(ctx, id, "bench", opts.Subscription); err != nil {
			return nil, err
		}
		return &koDriver{
			openPub: func(ctx context.Context, cfg *publish.Config) (*publish.Publisher, error) {
				return postgres.OpenTopic(ctx, pool, id, opts, cfg)
			},
			openSub: func(ctx context.Context, cfg *subscribe.Config) (*subscribe.Subscriber, error) {
				return postgres.OpenSubscription(ctx, pool, id, "bench", opts, cfg)
			},
			cleanup: func() {},
		}, nil
	}
	t := koTuning{
		subscribe:  subscribe.Config{Workers: 64, MaxOutstanding: 2 * pgBatch},
		publish:    publish.Config{MaxBatch: pgBatch},
		publishers: 4, chunk: pgBatch,
	}
	return &backend{
		name:  "postgres",
		title: "PostgreSQL",
		note: fmt.Sprintf("Raw: pgx on a plain table (id, key, payload): COPY of %d rows per call from one goroutine; "+
			"%d goroutines each claiming %d rows with DELETE … FOR UPDATE SKIP LOCKED RETURNING (no order by key). "+
			"keyorder: Ordered, %s, %d outstanding, claims of up to %d. "+
			"River and watermill-sql: see -backend pgsuite.", pgBatch, pgConsumers, pgBatch, lanesNote(64), 2*pgBatch, pgBatch),
		systems: append([]system{{name: "raw pgx table", ref: true,
			open: func(ctx context.Context, id string) (endpoint, error) { return openPGRaw(ctx, pool, schema, id) }}},
			koSystems(f, t)...),
		close: func() {
			_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
			pool.Close()
		},
	}, nil
}

// pgRaw is a queue a pgx user writes by hand: a table, COPY in, DELETE …
// SKIP LOCKED out.
type pgRaw struct {
	pool  *pgxpool.Pool
	table pgx.Identifier
}

func openPGRaw(ctx context.Context, pool *pgxpool.Pool, schema, id string) (endpoint, error) {
	e := &pgRaw{pool: pool, table: pgx.Identifier{schema, "raw_" + strconv.Itoa(runSeq)}}
	_, err := pool.Exec(ctx, "CREATE TABLE "+e.table.Sanitize()+" (id bigserial PRIMARY KEY, key text NOT NULL, payload bytea NOT NULL)")
	if err != nil {
		return nil, err
	}
	return e, nil
}

func (e *pgRaw) publish(ctx context.Context, w *workload) error {
	for start := 0; start < w.n(); start += pgBatch {
		end := min(start+pgBatch, w.n())
		rows := make([][]any, 0, end-start)
		for i := start; i < end; i++ {
			rows = append(rows, []any{w.key(i), w.payloads[i]})
		}
		if _, err := e.pool.CopyFrom(ctx, e.table, []string{"key", "payload"}, pgx.CopyFromRows(rows)); err != nil {
			return err
		}
	}
	return nil
}

func (e *pgRaw) consume(ctx context.Context, chk *orderCheck) error {
	t := e.table.Sanitize()
	q := "WITH d AS (DELETE FROM " + t + " WHERE id IN (SELECT id FROM " + t + " ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING id, payload) " +
		"SELECT payload FROM d ORDER BY id"
	var wg sync.WaitGroup
	errs := make(chan error, pgConsumers)
	for range pgConsumers {
		wg.Go(func() {
			for ctx.Err() == nil {
				rows, err := e.pool.Query(ctx, q, pgBatch)
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
				got := 0
				var p []byte
				_, err = pgx.ForEachRow(rows, []any{&p}, func() error {
					chk.see(p)
					got++
					return nil
				})
				if err != nil {
					if ctx.Err() == nil && !errors.Is(err, context.Canceled) {
						errs <- err
					}
					return
				}
				if got == 0 {
					// Empty: poll again shortly (a hand-written queue's
					// usual shape; NOTIFY would be the next step).
					select {
					case <-ctx.Done():
					case <-time.After(time.Millisecond):
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func (e *pgRaw) close() {
	_, _ = e.pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+e.table.Sanitize())
}
