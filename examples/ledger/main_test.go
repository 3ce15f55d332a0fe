package main

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder/internal/testenv"
)

// TestLedger runs the demo on the memory backend: it fails if the Ordered
// history is wrong.
func TestLedger(t *testing.T) {
	t.Setenv("KEYORDER_URL", "")
	if err := run(); err != nil {
		t.Fatal(err)
	}
}

// TestLedgerPostgres runs the demo on PostgreSQL, where the balances live
// in the database and each adjustment commits with its acknowledgement
// (postgres.HandleTx): the Ordered history must be exact (run checks it:
// every adjustment applied once, 101's failed attempt rolled back, read
// back from the database), and nothing is left pending or dead-lettered.
func TestLedgerPostgres(t *testing.T) {
	base := testenv.Require(t, testenv.Postgres)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	schema := fmt.Sprintf("keyorder_ledger_test_%d", time.Now().UnixNano()%1e9)
	q := u.Query()
	q.Set("topic", "ledger.adjustments")
	q.Set("schema", schema)
	q.Set("migrate", "true")
	q.Set("create", "true")
	u.RawQuery = q.Encode()
	t.Setenv("KEYORDER_URL", u.String())
	if err := run(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	defer pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	var pending, dead int
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT (SELECT count(*) FROM %[1]s.deliveries), (SELECT count(*) FROM %[1]s.dead_letters)`, schema)).
		Scan(&pending, &dead); err != nil {
		t.Fatal(err)
	}
	if pending != 0 || dead != 0 {
		t.Errorf("after the run: %d deliveries pending, %d dead letters; want none", pending, dead)
	}
}
