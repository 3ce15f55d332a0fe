package postgres_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/testenv"
	"github.com/keyorder/keyorder/policy"
)

// requirePG returns the test server's URL (KEYORDER_PG_URL), skipping the
// test without one, or failing it where servers are required (CI).
func requirePG(t testing.TB) string {
	t.Helper()
	return testenv.Require(t, testenv.Postgres)
}

// env is one test's PostgreSQL: a pool and a fresh, migrated schema that is
// dropped at the end.
type env struct {
	t      testing.TB
	url    string
	pool   *pgxpool.Pool
	schema string
	admin  *postgres.Admin
}

func newEnv(t testing.TB) *env {
	t.Helper()
	u := requirePG(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, url: u, pool: pool, schema: fmt.Sprintf("kotest_%d", rand.Uint32())}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+e.schema+" CASCADE"); err != nil {
			t.Logf("drop schema: %v", err)
		}
		pool.Close()
	})
	if _, err := postgres.Migrate(ctx, pool, postgres.DirectionUp, &postgres.MigrateOptions{Schema: e.schema}); err != nil {
		t.Fatal(err)
	}
	if e.admin, err = postgres.NewAdmin(pool, &postgres.Options{Schema: e.schema}); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) opts(o *postgres.Options) *postgres.Options {
	if o == nil {
		o = &postgres.Options{}
	}
	c := *o
	c.Schema = e.schema
	return &c
}

func (e *env) topic(name string, o *postgres.Options) *postgres.Topic {
	e.t.Helper()
	o = e.opts(o)
	o.Create = true
	tp, err := postgres.OpenTopicDriver(context.Background(), e.pool, name, o)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { tp.Close() })
	return tp
}

func (e *env) sub(topic, name string, ordering policy.Ordering, o *postgres.Options) *postgres.Subscription {
	e.t.Helper()
	o = e.opts(o)
	o.Create = true
	o.Subscription = &postgres.SubscriptionOptions{Ordering: ordering}
	s, err := postgres.OpenSubscriptionDriver(context.Background(), e.pool, topic, name, o)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { s.Close() })
	return s
}

func msg(key, id string) *driver.Message {
	return &driver.Message{ID: id, Key: key, Payload: []byte(id)}
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// receiveN receives until it has n messages or the context ends.
func receiveN(t testing.TB, ctx context.Context, s driver.Subscription, n int) []*driver.Message {
	t.Helper()
	var out []*driver.Message
	for len(out) < n {
		ms, err := s.Receive(ctx, n-len(out))
		if err != nil {
			t.Fatalf("receive after %d of %d: %v", len(out), n, err)
		}
		out = append(out, ms...)
	}
	return out
}

// receiveNone asserts that nothing is claimable within d.
func receiveNone(t testing.TB, s driver.Subscription, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	ms, err := s.Receive(ctx, 10)
	if err == nil {
		t.Fatalf("expected nothing, received %v", ids(ms))
	}
}

func ids(ms []*driver.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}
