package sqs_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/adapters/sqs"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/testenv"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// countingStore counts the calls a driver makes to its start store.
type countingStore struct {
	driver.StartStore
	runs, records, forgets, ids atomic.Int64
}

func (c *countingStore) Runs(ctx context.Context, sub string, ids []string) (map[string]int, error) {
	c.runs.Add(1)
	c.ids.Add(int64(len(ids)))
	return c.StartStore.Runs(ctx, sub, ids)
}

func (c *countingStore) Record(ctx context.Context, sub string, runs map[string]int) error {
	c.records.Add(1)
	c.ids.Add(int64(len(runs)))
	return c.StartStore.Record(ctx, sub, runs)
}

func (c *countingStore) Forget(ctx context.Context, sub string, ids []string) error {
	c.forgets.Add(1)
	c.ids.Add(int64(len(ids)))
	return c.StartStore.Forget(ctx, sub, ids)
}

// TestStartStoreCost measures what a PostgreSQL start store costs a
// consumer: the same messages consumed without and with one, side by side
// in one run, with an instant handler (no start is written) and one that
// takes 150 ms (every start is written). It runs when
// KEYORDER_START_STORE_COST is set (to the message count).
func TestStartStoreCost(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KEYORDER_START_STORE_COST"))
	if n <= 0 {
		t.Skip("set KEYORDER_START_STORE_COST=N to measure")
	}
	u := testenv.Require(t, testenv.Postgres)
	pool, err := pgxpool.New(t.Context(), u)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	schema := fmt.Sprintf("kocost_%d", time.Now().UnixNano()%1e9)
	defer pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	if _, err := postgres.Migrate(t.Context(), pool, postgres.DirectionUp, &postgres.MigrateOptions{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	pg, err := postgres.NewStartStore(pool, &postgres.StartStoreOptions{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	for _, work := range []time.Duration{0, 150 * time.Millisecond} {
		m := n
		if work > 0 {
			m = n / 4
		}
		for round := range 2 {
			for _, store := range []bool{false, true} {
				t.Run(fmt.Sprintf("handler=%v/round=%d/store=%v", work, round, store), func(t *testing.T) {
					var cs *countingStore
					opts := &sqs.Options{Ordering: policy.Ordered, WaitTime: time.Second}
					if store {
						cs = &countingStore{StartStore: pg}
						opts.StartStore = cs
					}
					rate := consumeRate(t, m, work, opts)
					if cs != nil {
						t.Logf("store calls: %d reads, %d records, %d forgets, %d ids (%.3f calls per message)",
							cs.runs.Load(), cs.records.Load(), cs.forgets.Load(), cs.ids.Load(),
							float64(cs.runs.Load()+cs.records.Load()+cs.forgets.Load())/float64(m))
					}
					t.Logf("%.0f msgs/s", rate)
				})
			}
		}
	}
}

// consumeRate publishes m messages over 200 keys and returns how many per
// second a subscriber (64 workers) handles, each handler taking work.
func consumeRate(t *testing.T, m int, work time.Duration, opts *sqs.Options) float64 {
	client, _ := newClient(t)
	ctx := t.Context()
	q, err := sqs.CreateQueue(ctx, client, uniqueQueue("cost"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteQueues(client, q) })
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	p, err := sqs.OpenTopic(ctx, client, q, nil, &publish.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ms := make([]*keyorder.Message, m)
	for i := range ms {
		ms[i] = &keyorder.Message{Key: fmt.Sprintf("k%03d", i%200), Payload: []byte("x")}
	}
	for i := 0; i < m; i += 1000 {
		if _, err := p.PublishBatch(ctx, ms[i:min(i+1000, m)]); err != nil {
			t.Fatal(err)
		}
	}
	p.Close(context.Background())
	s, err := sqs.OpenSubscription(ctx, client, q, opts, &subscribe.Config{Workers: 64, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	var done atomic.Int64
	start := time.Now()
	rctx, cancel := context.WithCancel(context.Background())
	go s.Run(rctx, func(ctx context.Context, d *keyorder.Delivery) error {
		if work > 0 {
			time.Sleep(work)
		}
		done.Add(1)
		return nil
	})
	for done.Load() < int64(m) && time.Since(start) < 5*time.Minute {
		time.Sleep(10 * time.Millisecond)
	}
	el := time.Since(start)
	cancel()
	s.Close(context.Background())
	if done.Load() < int64(m) {
		t.Fatalf("handled %d of %d", done.Load(), m)
	}
	return float64(m) / el.Seconds()
}
