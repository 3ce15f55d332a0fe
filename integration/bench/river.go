package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

type noopArgs struct {
	Payload []byte `json:"p"`
}

func (noopArgs) Kind() string { return "noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
	done *atomic.Int64
}

func (w *noopWorker) Work(ctx context.Context, job *river.Job[noopArgs]) error {
	w.done.Add(1)
	return nil
}

// benchRiver inserts c.n no-op jobs with InsertMany in batches, then works
// them with FetchCooldown at 1ms (so the client is not idle-bound).
func benchRiver(ctx context.Context, pool *pgxpool.Pool, c config) (ins, work float64, err error) {
	schema := fmt.Sprintf("riverbench_%d", time.Now().UnixNano()%1e9)
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return 0, 0, err
	}
	defer pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
	drv := riverpgxv5.New(pool)
	mig, err := rivermigrate.New(drv, &rivermigrate.Config{Schema: schema})
	if err != nil {
		return 0, 0, err
	}
	if _, err := mig.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return 0, 0, err
	}
	var done atomic.Int64
	workers := river.NewWorkers()
	river.AddWorker(workers, &noopWorker{done: &done})
	client, err := river.NewClient(drv, &river.Config{
		Schema:            schema,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 100}},
		Workers:           workers,
		FetchCooldown:     time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            quietLogger(),
	})
	if err != nil {
		return 0, 0, err
	}
	payload := make([]byte, c.size)
	cpu := c.srv.start()
	start := time.Now()
	for i := 0; i < c.n; i += c.batch {
		params := make([]river.InsertManyParams, 0, c.batch)
		for j := i; j < min(i+c.batch, c.n); j++ {
			params = append(params, river.InsertManyParams{Args: noopArgs{Payload: payload}})
		}
		if _, err := client.InsertMany(ctx, params); err != nil {
			return 0, 0, err
		}
	}
	ins = float64(c.n) / time.Since(start).Seconds()
	cpu.report("river", "insert (InsertMany)", c.n)

	cpu = c.srv.start()
	start = time.Now()
	if err := client.Start(ctx); err != nil {
		return 0, 0, err
	}
	deadline := time.After(10 * time.Minute)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for done.Load() < int64(c.n) {
		select {
		case <-deadline:
			return 0, 0, fmt.Errorf("river: %d of %d worked in 10 minutes", done.Load(), c.n)
		case <-tick.C:
		}
	}
	work = float64(c.n) / time.Since(start).Seconds()
	cpu.report("river", "work", c.n)
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_ = client.Stop(stopCtx)
	return ins, work, nil
}
