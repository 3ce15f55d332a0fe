// Command ledger is the balance example from keyorder's design: adjustments
// to an account must be applied in order, and a failed adjustment must hold
// the ones behind it.
//
// Message 101 subtracts 800 from acct-42 and fails once (the balance service
// times out); 102 adds 500; 103 subtracts 600. The same messages are consumed
// by two subscriptions: one Ordered, where 102 and 103 wait for 101's retry,
// and one Exclusive, where they may overtake it and the account goes through
// a different balance history. acct-7 runs beside them, unaffected.
//
// It runs on the in-memory backend by default; set KEYORDER_URL to a topic
// URL of another backend (its adapter must be linked in) to run it there.
// It exits non-zero if the Ordered history is wrong.
//
// On PostgreSQL (a postgres:// URL) the balances and their history live in
// the same database, in schema keyorder_ledger_demo, and each adjustment
// is applied with postgres.HandleTx: the balance update, its history line
// and the message's acknowledgement commit in one transaction. A crash or
// a redelivery can then never apply an adjustment twice, so the ledger
// needs no table of applied message IDs (the idempotency table a ledger
// keeps on an at-least-once queue).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder"
	_ "github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/adapters/postgres"
	_ "github.com/keyorder/keyorder/adapters/pubsub"
	_ "github.com/keyorder/keyorder/adapters/pulsar"
	_ "github.com/keyorder/keyorder/adapters/sqs"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

type adjustment struct {
	id      string
	account string
	delta   int
}

var adjustments = []adjustment{
	{"101", "acct-42", -800},
	{"102", "acct-42", +500},
	{"103", "acct-42", -600},
	{"201", "acct-7", +100},
	{"202", "acct-7", -50},
}

const opening = 1000

// ledger applies adjustments and records each account's history: in
// memory, or in PostgreSQL when db is set (see handleTx).
type ledger struct {
	mu       sync.Mutex
	balance  map[string]int
	history  map[string][]string
	failed   map[string]bool
	applied  int
	complete chan struct{}

	db       *pgxpool.Pool // PostgreSQL: balances and history in schema demoSchema
	run, sub string        // the rows of this run and subscription
}

func newLedger() *ledger {
	return &ledger{balance: map[string]int{}, history: map[string][]string{}, failed: map[string]bool{}, complete: make(chan struct{})}
}

func (l *ledger) handle(ctx context.Context, d *keyorder.Delivery) error {
	parts := strings.Split(string(d.Payload), " ")
	delta, _ := strconv.Atoi(parts[1])
	l.mu.Lock()
	defer l.mu.Unlock()
	if parts[0] == "101" && !l.failed["101"] {
		l.failed["101"] = true
		l.history[d.Key] = append(l.history[d.Key], "101 failed")
		return keyorder.RetryAfter(errors.New("balance service timed out"), 300*time.Millisecond)
	}
	if _, ok := l.balance[d.Key]; !ok {
		l.balance[d.Key] = opening
	}
	l.balance[d.Key] += delta
	l.history[d.Key] = append(l.history[d.Key], fmt.Sprintf("%s %+d = %d", parts[0], delta, l.balance[d.Key]))
	l.applied++
	if l.applied == len(adjustments) {
		close(l.complete)
	}
	return nil
}

// demoSchema holds the balances and history of the PostgreSQL runs.
const demoSchema = "keyorder_ledger_demo"

// handleTx applies an adjustment inside tx, which postgres.HandleTx opens
// and commits together with the message's acknowledgement. The injected
// failure of 101 is written outside tx (it is a record of an attempt, not
// an effect: tx rolls back).
func (l *ledger) handleTx(ctx context.Context, tx pgx.Tx, d *keyorder.Delivery) error {
	parts := strings.Split(string(d.Payload), " ")
	delta, _ := strconv.Atoi(parts[1])
	l.mu.Lock()
	fail := parts[0] == "101" && !l.failed["101"]
	l.failed["101"] = l.failed["101"] || fail
	l.mu.Unlock()
	if fail {
		if _, err := l.db.Exec(ctx, "INSERT INTO "+demoSchema+".history (run, sub, account, entry) VALUES ($1, $2, $3, '101 failed')",
			l.run, l.sub, d.Key); err != nil {
			return err
		}
		return keyorder.RetryAfter(errors.New("balance service timed out"), 300*time.Millisecond)
	}
	var balance int
	if err := tx.QueryRow(ctx, `INSERT INTO `+demoSchema+`.balances AS b (run, sub, account, balance) VALUES ($1, $2, $3, $4::bigint + $5::bigint)
		ON CONFLICT (run, sub, account) DO UPDATE SET balance = b.balance + $5::bigint RETURNING b.balance`,
		l.run, l.sub, d.Key, opening, delta).Scan(&balance); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, "INSERT INTO "+demoSchema+".history (run, sub, account, entry) VALUES ($1, $2, $3, $4)",
		l.run, l.sub, d.Key, fmt.Sprintf("%s %+d = %d", parts[0], delta, balance))
	return err
}

// handler returns the subscriber's handler: handle in memory, or handleTx
// through postgres.HandleTx (counting the committed adjustments).
func (l *ledger) handler() subscribe.HandlerFunc {
	if l.db == nil {
		return l.handle
	}
	h := postgres.HandleTx(l.db, l.handleTx)
	return func(ctx context.Context, d *keyorder.Delivery) error {
		if err := h(ctx, d); err != nil {
			return err
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		l.applied++
		if l.applied == len(adjustments) {
			close(l.complete)
		}
		return nil
	}
}

// loadHistory reads the history of a PostgreSQL run back into l.history,
// then deletes the run's rows.
func (l *ledger) loadHistory(ctx context.Context) error {
	rows, err := l.db.Query(ctx, "SELECT account, entry FROM "+demoSchema+".history WHERE run = $1 AND sub = $2 ORDER BY seq", l.run, l.sub)
	if err != nil {
		return err
	}
	var account, entry string
	if _, err := pgx.ForEachRow(rows, []any{&account, &entry}, func() error {
		l.history[account] = append(l.history[account], entry)
		return nil
	}); err != nil {
		return err
	}
	for _, t := range []string{"history", "balances"} {
		if _, err := l.db.Exec(ctx, "DELETE FROM "+demoSchema+"."+t+" WHERE run = $1 AND sub = $2", l.run, l.sub); err != nil {
			return err
		}
	}
	return nil
}

// openBalances opens a pool on the database of a postgres:// topic URL
// (its keyorder parameters removed) and creates the demo's tables.
func openBalances(ctx context.Context, topicURL string) (*pgxpool.Pool, error) {
	u, err := url.Parse(topicURL)
	if err != nil {
		return nil, err
	}
	q := url.Values{}
	for k, v := range u.Query() {
		if strings.HasPrefix(k, "ssl") || k == "connect_timeout" || k == "application_name" {
			q[k] = v
		}
	}
	q.Set("pool_max_conns", "12") // a transaction per worker (2 subscriptions × 4), and room
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		return nil, err
	}
	for _, stmt := range []string{
		"CREATE SCHEMA IF NOT EXISTS " + demoSchema,
		"CREATE TABLE IF NOT EXISTS " + demoSchema + ".balances (run text, sub text, account text, balance bigint NOT NULL, PRIMARY KEY (run, sub, account))",
		"CREATE TABLE IF NOT EXISTS " + demoSchema + ".history (seq bigserial PRIMARY KEY, run text NOT NULL, sub text NOT NULL, account text NOT NULL, entry text NOT NULL)",
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			pool.Close()
			return nil, fmt.Errorf("ledger tables: %w", err)
		}
	}
	return pool, nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "ledger:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx := context.Background()
	topicURL := os.Getenv("KEYORDER_URL")
	if topicURL == "" {
		topicURL = "mem://ledger.adjustments"
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	run := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)

	var db *pgxpool.Pool
	if strings.HasPrefix(topicURL, "postgres://") || strings.HasPrefix(topicURL, "postgresql://") {
		var err error
		if db, err = openBalances(ctx, topicURL); err != nil {
			return err
		}
		defer db.Close()
	}

	results := map[string]*ledger{}
	var subs []*subscribe.Subscriber
	var wg sync.WaitGroup
	for _, ordering := range []string{"ordered", "exclusive"} {
		u, err := subscriptionURL(topicURL, "apply-balance-"+ordering+"-"+run, ordering)
		if err != nil {
			return err
		}
		sub, err := subscribe.Open(ctx, u, &subscribe.Config{Workers: 4})
		if err != nil {
			return fmt.Errorf("open %s subscription: %w", ordering, err)
		}
		l := newLedger()
		l.db, l.run, l.sub = db, run, ordering
		results[ordering] = l
		subs = append(subs, sub)
		wg.Go(func() {
			if err := sub.Run(ctx, l.handler()); err != nil {
				fmt.Fprintln(os.Stderr, "subscriber:", err)
			}
		})
	}

	pub, err := publish.Open(ctx, topicURL, nil)
	if err != nil {
		return err
	}
	for _, a := range adjustments {
		m := &keyorder.Message{ID: run + "-" + a.id, Key: a.account, Payload: fmt.Appendf(nil, "%s %d", a.id, a.delta)}
		if _, err := pub.Publish(ctx, m); err != nil {
			return fmt.Errorf("publish %s: %w", a.id, err)
		}
	}
	if err := pub.Close(ctx); err != nil {
		return err
	}

	timeout := time.After(60 * time.Second)
	for name, l := range results {
		select {
		case <-l.complete:
		case <-timeout:
			return fmt.Errorf("%s subscription did not apply every adjustment within 60s", name)
		}
	}
	for _, s := range subs {
		s.Close(ctx)
	}
	wg.Wait()
	if db != nil {
		for _, l := range results {
			if err := l.loadHistory(ctx); err != nil {
				return err
			}
		}
	}

	fmt.Printf("keyorder ledger demo on %s (opening balance %d)\n\n", redact(topicURL), opening)
	for _, ordering := range []string{"ordered", "exclusive"} {
		l := results[ordering]
		for _, acct := range []string{"acct-42", "acct-7"} {
			fmt.Printf("%-9s %-7s  %s\n", ordering, acct, strings.Join(l.history[acct], "  ->  "))
		}
	}
	want := []string{"101 failed", "101 -800 = 200", "102 +500 = 700", "103 -600 = 100"}
	got := results["ordered"].history["acct-42"]
	if !slices.Equal(got, want) {
		return fmt.Errorf("ordered history of acct-42 is %q, want %q", got, want)
	}
	fmt.Println("\nOrdered: 102 and 103 waited for 101's retry; the history is the one the ledger was written in.")
	if db != nil {
		fmt.Println("PostgreSQL: each adjustment, its history line and its acknowledgement committed in one transaction (postgres.HandleTx); no idempotency table.")
	}
	if ex := results["exclusive"].history["acct-42"]; !slices.Equal(ex, want) {
		fmt.Println("Exclusive: later adjustments overtook the failed 101, a different balance history.")
	}
	return nil
}

// subscriptionURL adds subscription and ordering parameters to a topic URL,
// the convention every keyorder adapter accepts.
func subscriptionURL(topicURL, name, ordering string) (string, error) {
	u, err := url.Parse(topicURL)
	if err != nil {
		return "", err
	}
	q := u.Query()
	q.Set("subscription", name)
	q.Set("ordering", ordering)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// redact hides a URL's password.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return s
	}
	return u.Redacted()
}
