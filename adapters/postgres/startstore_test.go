package postgres_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/postgres"
)

// TestStartStore: records are per subscription and message, never
// lowered, deleted by Forget, and expired by Expire after the retention.
func TestStartStore(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	st, err := postgres.NewStartStore(e.pool, &postgres.StartStoreOptions{Schema: e.schema, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Record(ctx, "q1", map[string]int{"a": 2, "b": 1}); err != nil {
		t.Fatal(err)
	}
	if err := st.Record(ctx, "q1", map[string]int{"a": 1}); err != nil { // a late write of another process
		t.Fatal(err)
	}
	if err := st.Record(ctx, "q2", map[string]int{"a": 5}); err != nil {
		t.Fatal(err)
	}
	got, err := st.Runs(ctx, "q1", []string{"a", "b", "c"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["a"] != 2 || got["b"] != 1 {
		t.Fatalf("q1 runs %v, want map[a:2 b:1]", got)
	}
	if err := st.Forget(ctx, "q1", []string{"a"}); err != nil {
		t.Fatal(err)
	}
	got, _ = st.Runs(ctx, "q1", []string{"a", "b"})
	if _, ok := got["a"]; ok || got["b"] != 1 {
		t.Fatalf("after Forget(a): %v, want map[b:1]", got)
	}
	if got, _ := st.Runs(ctx, "q2", []string{"a"}); got["a"] != 5 {
		t.Fatalf("q2 runs %v: another subscription's records must stay apart", got)
	}
	if _, err := e.pool.Exec(ctx, "UPDATE "+e.schema+".start_runs SET updated_at = now() - interval '2 hours' WHERE sub = 'q2'"); err != nil {
		t.Fatal(err)
	}
	n, err := st.Expire(ctx)
	if err != nil || n != 1 {
		t.Fatalf("Expire: %d, %v; want 1 (q2's record, 2 hours old)", n, err)
	}
	if got, _ := st.Runs(ctx, "q1", []string{"b"}); got["b"] != 1 {
		t.Fatalf("Expire deleted a fresh record: %v", got)
	}
}

// Bad options are refused with ErrInvalidConfig naming the field (no
// server: a pool connects lazily).
func TestNewStartStoreInvalid(t *testing.T) {
	pool, err := pgxpool.New(t.Context(), "postgres://u@127.0.0.1:1/db")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := postgres.NewStartStore(nil, nil); !errors.Is(err, keyorder.ErrInvalidConfig) {
		t.Errorf("nil pool: %v, want ErrInvalidConfig", err)
	}
	for o, want := range map[*postgres.StartStoreOptions]string{{Schema: "Bad-Schema"}: "schema", {Retention: -time.Second}: "Retention"} {
		_, err := postgres.NewStartStore(pool, o)
		if !errors.Is(err, keyorder.ErrInvalidConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: %v, want ErrInvalidConfig naming %s", o, err, want)
		}
	}
}
