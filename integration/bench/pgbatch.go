// The ordered-batch benchmark (-backend pgbatch): a hot key on keyorder's
// PostgreSQL queue, handled one message at a time and in ordered batches
// (subscribe.RunBatch), to show how batches lift the per-key ceiling that
// Ordered imposes.
//
// For 1 key and then 10 keys, and batch sizes 1, 10 and 100, it publishes
// -n messages (Ordered subscription, claim chains of 100 so that one claim
// can carry a whole batch), then consumes them with RunBatch (a no-op
// handler that checks each key's order) and reports msgs/s in all and per
// key, as a Markdown table (stdout, and DIR/pgbatch.md with -out).

package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/subscribe"
)

// pgBatchChain is the claim chain length the batch benchmark runs with.
const pgBatchChain = 100

type pgBatchRow struct {
	keys, size int
	n          int
	rate       float64 // msgs/s, all keys
	batches    int64
}

// pgBatchBench runs the ordered-batch benchmark and writes its table.
func pgBatchBench(ctx context.Context, o options) error {
	dsn := os.Getenv("KEYORDER_PG_URL")
	if dsn == "" {
		return fmt.Errorf("KEYORDER_PG_URL is not set: run under `go run ./integration/cmd/testenv run --only postgres -- ...`")
	}
	pool, err := pgxpool.New(ctx, withPoolSize(dsn, 8))
	if err != nil {
		return err
	}
	defer pool.Close()
	started := time.Now()
	var rows []pgBatchRow
	for _, keys := range []int{1, 10} {
		for _, size := range []int{1, 10, 100} {
			n := o.n
			if size == 1 {
				n = max(n/4, 500) // one message per round trip: keep the run short
			}
			r, err := pgBatchRun(ctx, pool, dsn, keys, size, n)
			if err != nil {
				return fmt.Errorf("keys %d, batch %d: %w", keys, size, err)
			}
			fmt.Fprintf(os.Stderr, "pgbatch: keys %d batch %d: %.0f msgs/s (%d batches)\n", keys, size, r.rate, r.batches)
			rows = append(rows, r)
		}
	}
	var b strings.Builder
	pgBatchTable(&b, rows, started)
	fmt.Print(b.String())
	if o.out != "" {
		if err := os.MkdirAll(o.out, 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(o.out, "pgbatch.md"), []byte(b.String()), 0o644)
	}
	return nil
}

func pgBatchTable(w io.Writer, rows []pgBatchRow, started time.Time) {
	fmt.Fprintf(w, "# Ordered batches on PostgreSQL: hot keys\n\n")
	fmt.Fprintf(w, "%s, %s/%s, %d CPUs, load average (1 min) at the end: %.2f. Ordered subscription, claim chain %d, "+
		"subscribe.RunBatch with a no-op handler (order checked), Workers 4; each run publishes its messages first, "+
		"then times their consumption.\n\n",
		started.UTC().Format(time.RFC3339), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), loadAvg(), pgBatchChain)
	fmt.Fprintf(w, "| keys | batch size | messages | batches handled | msgs/s (all) | msgs/s per key | vs batch 1 |\n")
	fmt.Fprintf(w, "|---:|---:|---:|---:|---:|---:|---:|\n")
	base := map[int]float64{}
	for _, r := range rows {
		if r.size == 1 {
			base[r.keys] = r.rate
		}
		ratio := "—"
		if b := base[r.keys]; b > 0 {
			ratio = fmt.Sprintf("%.1fx", r.rate/b)
		}
		fmt.Fprintf(w, "| %d | %d | %d | %d | %.0f | %.0f | %s |\n", r.keys, r.size, r.n, r.batches, r.rate, r.rate/float64(r.keys), ratio)
	}
}

// pgBatchRun publishes n messages over keys keys into a fresh schema and
// times their consumption in batches of up to size.
func pgBatchRun(ctx context.Context, pool *pgxpool.Pool, dsn string, keys, size, n int) (pgBatchRow, error) {
	row := pgBatchRow{keys: keys, size: size, n: n}
	schema := fmt.Sprintf("kobatch_%d", time.Now().UnixNano()%1e9)
	if _, err := postgres.Migrate(ctx, pool, postgres.DirectionUp, &postgres.MigrateOptions{Schema: schema}); err != nil {
		return row, err
	}
	defer func() { _, _ = pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+schema+" CASCADE") }()
	u, err := url.Parse(withPoolSize(dsn, 4))
	if err != nil {
		return row, err
	}
	q := u.Query()
	q.Set("schema", schema)
	q.Set("create", "true")
	q.Set("ordering", "ordered")
	q.Set("chain", strconv.Itoa(pgBatchChain))
	q.Set("topic", "bench")
	u.RawQuery = q.Encode()
	topic, err := driver.DefaultMux().OpenTopic(ctx, u.String())
	if err != nil {
		return row, err
	}
	defer topic.Close()
	q.Set("subscription", "bench")
	u.RawQuery = q.Encode()
	sub, err := subscribe.Open(ctx, u.String(), &subscribe.Config{
		Workers: 4,
		Batch:   &subscribe.BatchConfig{MaxSize: size},
	})
	if err != nil {
		return row, err
	}
	for i := 0; i < n; {
		batch := make([]*driver.Message, 0, 1000)
		for ; i < n && len(batch) < 1000; i++ {
			p := make([]byte, 100)
			binary.BigEndian.PutUint64(p, uint64(i/keys))
			batch = append(batch, &driver.Message{ID: strconv.Itoa(i), Key: "key-" + strconv.Itoa(i%keys), Payload: p})
		}
		if err := topic.SendBatch(ctx, batch); err != nil {
			sub.Close(ctx)
			return row, err
		}
	}
	var (
		done      atomic.Int64
		batches   atomic.Int64
		mu        sync.Mutex
		last      = map[string]int64{}
		violation atomic.Value
		finished  = make(chan struct{})
		once      sync.Once
	)
	h := func(ctx context.Context, ds []*keyorder.Delivery) error {
		mu.Lock()
		for _, d := range ds {
			seq := int64(binary.BigEndian.Uint64(d.Payload))
			if prev, ok := last[d.Key]; ok && seq != prev+1 && seq > prev {
				violation.Store(fmt.Sprintf("key %s: %d after %d", d.Key, seq, prev))
			}
			if prev, ok := last[d.Key]; !ok || seq > prev {
				last[d.Key] = seq
			}
		}
		mu.Unlock()
		batches.Add(1)
		if done.Add(int64(len(ds))) >= int64(n) {
			once.Do(func() { close(finished) })
		}
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	start := time.Now()
	runErr := make(chan error, 1)
	go func() { runErr <- sub.RunBatch(rctx, h) }()
	select {
	case <-finished:
	case <-rctx.Done():
	}
	el := time.Since(start)
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer ccancel()
	if err := sub.Close(cctx); err != nil {
		return row, err
	}
	if err := <-runErr; err != nil {
		return row, err
	}
	if done.Load() < int64(n) {
		return row, fmt.Errorf("handled %d of %d before the timeout", done.Load(), n)
	}
	if v := violation.Load(); v != nil {
		return row, fmt.Errorf("order violation: %v", v)
	}
	row.rate = float64(n) / el.Seconds()
	row.batches = batches.Load()
	return row, nil
}
