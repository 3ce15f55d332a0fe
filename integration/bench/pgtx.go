// The exactly-once cost benchmark (-backend pgtx): what completing a
// message in the handler's own transaction (postgres.HandleTx, CompleteTx)
// costs per message against the plain acknowledgement, side by side in one
// run.
//
// Both sides run the same handler effect on keyorder's PostgreSQL queue
// (Ordered, -keys keys): a transaction that updates an account row and
// inserts an effect row. "plain ack" commits that transaction itself and
// returns nil, so the subscriber acknowledges the message afterwards (in
// batches, off the handler's path): at-least-once, the effect twice after a
// crash between the two. "HandleTx" runs the same statements through
// postgres.HandleTx, which completes the message inside the transaction
// (the lease-guarded delete of sqlComplete) before the commit: exactly
// once. The rounds alternate the two; the table gives msgs/s, µs per
// message and the ratio (stdout, and DIR/pgtx.md with -out).

package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/subscribe"
)

// pgTxWorkers is the subscriber's Workers on both sides; the pool has room
// for a transaction per worker and the subscriber's own statements.
const pgTxWorkers = 8

// pgTxBench runs the exactly-once cost benchmark and writes its table.
func pgTxBench(ctx context.Context, o options) error {
	dsn := os.Getenv("KEYORDER_PG_URL")
	if dsn == "" {
		return fmt.Errorf("KEYORDER_PG_URL is not set: run under `go run ./integration/cmd/testenv run --only postgres -- ...`")
	}
	keys := 1000
	if len(o.keys) > 0 {
		keys = o.keys[0]
	}
	rounds := max(o.rounds, 1)
	started := time.Now()
	rates := map[bool][]float64{}
	for r := range rounds {
		for _, tx := range []bool{r%2 == 1, r%2 == 0} { // alternate which side goes first
			rate, err := pgTxRun(ctx, dsn, keys, o.n, tx)
			if err != nil {
				return fmt.Errorf("round %d, HandleTx %v: %w", r+1, tx, err)
			}
			fmt.Fprintf(os.Stderr, "pgtx: round %d %s: %.0f msgs/s\n", r+1, pgTxName(tx), rate)
			rates[tx] = append(rates[tx], rate)
		}
	}
	var b strings.Builder
	pgTxTable(&b, rates, keys, o.n, started)
	fmt.Print(b.String())
	if o.out != "" {
		if err := os.MkdirAll(o.out, 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(o.out, "pgtx.md"), []byte(b.String()), 0o644)
	}
	return nil
}

func pgTxName(tx bool) string {
	if tx {
		return "HandleTx (completion in the transaction)"
	}
	return "plain ack (own transaction, then Ack)"
}

func medianRate(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func pgTxTable(w io.Writer, rates map[bool][]float64, keys, n int, started time.Time) {
	fmt.Fprintf(w, "# Exactly-once effects on PostgreSQL: HandleTx vs the plain ack\n\n")
	fmt.Fprintf(w, "%s, %s/%s, %d CPUs, load average (1 min) at the end: %.2f. Ordered subscription, %d messages over %d keys per run, "+
		"Workers %d; each message's handler updates an account row and inserts an effect row in a transaction. "+
		"plain ack: the handler commits, then the subscriber acknowledges (batched); HandleTx: the completion is "+
		"part of the transaction. Medians of %d alternating rounds; each run publishes first, then times the consumption.\n\n",
		started.UTC().Format(time.RFC3339), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), loadAvg(), n, keys, pgTxWorkers, len(rates[false]))
	fmt.Fprintf(w, "| handler | msgs/s (median) | rounds | µs per message (wall, ÷ workers: ×%d) | vs plain ack |\n", pgTxWorkers)
	fmt.Fprintf(w, "|---|---:|---|---:|---:|\n")
	base := medianRate(rates[false])
	for _, tx := range []bool{false, true} {
		m := medianRate(rates[tx])
		var rs []string
		for _, r := range rates[tx] {
			rs = append(rs, strconv.FormatFloat(r, 'f', 0, 64))
		}
		fmt.Fprintf(w, "| %s | %.0f | %s | %.0f | %.2fx |\n", pgTxName(tx), m, strings.Join(rs, ", "), 1e6/m, m/base)
	}
}

// pgTxRun publishes n messages over keys keys into a fresh schema and times
// their consumption with the effect handler, completed in its transaction
// (tx) or acknowledged after it.
func pgTxRun(ctx context.Context, dsn string, keys, n int, tx bool) (float64, error) {
	pool, err := pgxpool.New(ctx, withPoolSize(dsn, 2*pgTxWorkers+4))
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	schema := fmt.Sprintf("kotx_%d", time.Now().UnixNano()%1e9)
	if _, err := postgres.Migrate(ctx, pool, postgres.DirectionUp, &postgres.MigrateOptions{Schema: schema}); err != nil {
		return 0, err
	}
	defer func() { _, _ = pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+schema+" CASCADE") }()
	for _, s := range []string{
		"CREATE TABLE " + schema + ".accounts (id text PRIMARY KEY, balance bigint NOT NULL)",
		"INSERT INTO " + schema + ".accounts SELECT 'key-' || g, 0 FROM generate_series(0, " + strconv.Itoa(keys-1) + ") g",
		"CREATE TABLE " + schema + ".effects (n bigserial PRIMARY KEY, msg_id text NOT NULL)",
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			return 0, err
		}
	}
	u, err := url.Parse(withPoolSize(dsn, 4))
	if err != nil {
		return 0, err
	}
	q := u.Query()
	q.Set("schema", schema)
	q.Set("create", "true")
	q.Set("ordering", "ordered")
	q.Set("topic", "bench")
	u.RawQuery = q.Encode()
	topic, err := driver.DefaultMux().OpenTopic(ctx, u.String())
	if err != nil {
		return 0, err
	}
	defer topic.Close()
	sub, err := postgres.OpenSubscription(ctx, pool, "bench", "bench", &postgres.Options{Schema: schema, Create: true},
		&subscribe.Config{Workers: pgTxWorkers})
	if err != nil {
		return 0, err
	}
	for i := 0; i < n; {
		batch := make([]*driver.Message, 0, 1000)
		for ; i < n && len(batch) < 1000; i++ {
			batch = append(batch, &driver.Message{ID: strconv.Itoa(i), Key: "key-" + strconv.Itoa(i%keys), Payload: make([]byte, 100)})
		}
		if err := topic.SendBatch(ctx, batch); err != nil {
			sub.Close(ctx)
			return 0, err
		}
	}
	var (
		done     atomic.Int64
		finished = make(chan struct{})
		once     sync.Once
	)
	effect := func(ctx context.Context, t pgx.Tx, d *keyorder.Delivery) error {
		if _, err := t.Exec(ctx, "UPDATE "+schema+".accounts SET balance = balance + 1 WHERE id = $1", d.Key); err != nil {
			return err
		}
		_, err := t.Exec(ctx, "INSERT INTO "+schema+".effects (msg_id) VALUES ($1)", d.ID)
		return err
	}
	count := func() {
		if done.Add(1) >= int64(n) {
			once.Do(func() { close(finished) })
		}
	}
	var h subscribe.HandlerFunc
	if tx {
		inner := postgres.HandleTx(pool, effect)
		h = func(ctx context.Context, d *keyorder.Delivery) error {
			err := inner(ctx, d)
			if err == nil {
				count()
			}
			return err
		}
	} else {
		h = func(ctx context.Context, d *keyorder.Delivery) error {
			err := pgx.BeginFunc(ctx, pool, func(t pgx.Tx) error { return effect(ctx, t, d) })
			if err == nil {
				count()
			}
			return err
		}
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	start := time.Now()
	runErr := make(chan error, 1)
	go func() { runErr <- sub.Run(rctx, h) }()
	select {
	case <-finished:
	case <-rctx.Done():
	}
	el := time.Since(start)
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer ccancel()
	if err := sub.Close(cctx); err != nil {
		return 0, err
	}
	if err := <-runErr; err != nil {
		return 0, err
	}
	if done.Load() < int64(n) {
		return 0, fmt.Errorf("handled %d of %d before the timeout", done.Load(), n)
	}
	var effects int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".effects").Scan(&effects); err != nil {
		return 0, err
	}
	if effects < int64(n) {
		return 0, fmt.Errorf("%d effects committed for %d messages", effects, n)
	}
	return float64(n) / el.Seconds(), nil
}
