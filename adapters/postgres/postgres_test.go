package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

func sendBatch(t testing.TB, tp *postgres.Topic, ms ...*driver.Message) {
	t.Helper()
	if err := tp.SendBatch(context.Background(), ms); err != nil {
		t.Fatal(err)
	}
}

func TestMigrateIdempotent(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t, 30*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			res, err := postgres.Migrate(ctx, e.pool, postgres.DirectionUp, &postgres.MigrateOptions{Schema: e.schema})
			if err == nil && len(res.Applied) != 0 {
				err = fmt.Errorf("re-applied %v", res.Applied)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	res, err := postgres.Migrate(ctx, e.pool, postgres.DirectionDown, &postgres.MigrateOptions{Schema: e.schema, Steps: 4})
	if err != nil || res.Version != 1 || len(res.Applied) != 4 {
		t.Fatalf("down: %+v %v", res, err)
	}
	res, err = postgres.Migrate(ctx, e.pool, postgres.DirectionUp, &postgres.MigrateOptions{Schema: e.schema})
	if err != nil || res.Version != 5 {
		t.Fatalf("up again: %+v %v", res, err)
	}
}

func TestOpenMissing(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t, 10*time.Second)
	if _, err := postgres.OpenTopicDriver(ctx, e.pool, "nope", e.opts(nil)); !errors.Is(err, keyorder.ErrNotFound) {
		t.Fatalf("OpenTopic missing: %v", err)
	}
	if _, err := postgres.OpenSubscriptionDriver(ctx, e.pool, "nope", "s", e.opts(nil)); !errors.Is(err, keyorder.ErrNotFound) {
		t.Fatalf("OpenSubscription missing: %v", err)
	}
	if err := e.admin.CreateSubscription(ctx, "t", "s", &postgres.SubscriptionOptions{Ordering: policy.Ordered}); err != nil {
		t.Fatal(err)
	}
	if err := e.admin.CreateSubscription(ctx, "t", "s", &postgres.SubscriptionOptions{Ordering: policy.Exclusive}); !errors.Is(err, keyorder.ErrInvalidConfig) {
		t.Fatalf("changing a subscription's policy: %v", err)
	}
}

// Under Ordered a nacked message holds its key until its retry time and is
// redelivered before anything behind it; other keys go on.
func TestOrderedNackHoldsKey(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("ledger", nil)
	s := e.sub("ledger", "apply", policy.Ordered, nil)
	sendBatch(t, tp, msg("A", "a1"), msg("A", "a2"), msg("A", "a3"))
	sendBatch(t, tp, msg("B", "b1"), msg("B", "b2"))
	ctx := ctxT(t, 20*time.Second)
	got := receiveN(t, ctx, s, 5)
	if want := []string{"a1", "a2", "a3", "b1", "b2"}; !slices.Equal(ids(got), want) {
		t.Fatalf("first receive %v, want %v (two chains)", ids(got), want)
	}
	for _, m := range got {
		if m.Attempt != 1 {
			t.Fatalf("%s attempt %d", m.ID, m.Attempt)
		}
	}
	// a1 fails: retry after 1s; the rest of A's chain goes back unrun.
	if err := s.Nack(ctx, got[0], time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, got[1:3]); err != nil {
		t.Fatal(err)
	}
	if err := s.Ack(ctx, got[3:]); err != nil {
		t.Fatal(err)
	}
	sendBatch(t, tp, msg("B", "b3"))
	start := time.Now()
	next := receiveN(t, ctx, s, 1)
	if next[0].ID != "b3" {
		t.Fatalf("got %s, want b3 (B is not held by A)", next[0].ID)
	}
	if err := s.Ack(ctx, next); err != nil {
		t.Fatal(err)
	}
	held, err := s.HeldKeys(ctx, 10)
	if err != nil || len(held) != 1 || held[0].Key != "A" || held[0].InFlight {
		t.Fatalf("held keys %+v %v", held, err)
	}
	again := receiveN(t, ctx, s, 3)
	if el := time.Since(start); el < 900*time.Millisecond {
		t.Fatalf("A redelivered after %v, before its retry time", el)
	}
	if !slices.Equal(ids(again), []string{"a1", "a2", "a3"}) || again[0].Attempt != 2 || again[1].Attempt != 1 {
		t.Fatalf("redelivery %v attempts %d %d", ids(again), again[0].Attempt, again[1].Attempt)
	}
	if err := s.Ack(ctx, again); err != nil {
		t.Fatal(err)
	}
	receiveNone(t, s, 200*time.Millisecond)
	st, err := s.BackendStats(ctx)
	if err != nil || st != (keyorder.BackendStats{}) {
		t.Fatalf("stats after all acked: %+v %v", st, err)
	}
}

// Under Exclusive a message waiting for its retry is overtaken.
func TestExclusiveOvertakes(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	s := e.sub("t", "s", policy.Exclusive, &postgres.Options{ChainLength: 1})
	sendBatch(t, tp, msg("A", "a1"), msg("A", "a2"))
	ctx := ctxT(t, 20*time.Second)
	got := receiveN(t, ctx, s, 1)
	if got[0].ID != "a1" {
		t.Fatalf("got %s", got[0].ID)
	}
	// Exclusive: while a1 is in flight nothing else of A is claimed.
	receiveNone(t, s, 200*time.Millisecond)
	if err := s.Nack(ctx, got[0], 10*time.Second); err != nil {
		t.Fatal(err)
	}
	got = receiveN(t, ctx, s, 1)
	if got[0].ID != "a2" {
		t.Fatalf("got %s, want a2 overtaking a1", got[0].ID)
	}
	if err := s.Ack(ctx, got); err != nil {
		t.Fatal(err)
	}
	receiveNone(t, s, 200*time.Millisecond)
}

// Parallel puts no constraint on a key.
func TestParallel(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	s := e.sub("t", "s", policy.Parallel, nil)
	sendBatch(t, tp, msg("A", "a1"), msg("A", "a2"), msg("A", "a3"))
	ctx := ctxT(t, 20*time.Second)
	first := receiveN(t, ctx, s, 1)
	rest := receiveN(t, ctx, s, 2) // while a1 is in flight
	if err := s.Nack(ctx, first[0], time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Ack(ctx, rest); err != nil {
		t.Fatal(err)
	}
	receiveNone(t, s, 200*time.Millisecond)
}

// Keyless messages on an Ordered subscription belong to no group.
func TestKeylessOnOrdered(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	s := e.sub("t", "s", policy.Ordered, nil)
	sendBatch(t, tp, msg("", "s1"), msg("", "s2"))
	sendBatch(t, tp, msg("A", "a1"))
	ctx := ctxT(t, 20*time.Second)
	got := receiveN(t, ctx, s, 3)
	if !slices.Equal(ids(got), []string{"s1", "s2", "a1"}) {
		t.Fatalf("got %v", ids(got))
	}
	if err := s.Nack(ctx, got[0], time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Ack(ctx, got[1:]); err != nil {
		t.Fatal(err)
	}
	sendBatch(t, tp, msg("", "s3"))
	if got := receiveN(t, ctx, s, 1); got[0].ID != "s3" || got[0].Key != "" {
		t.Fatalf("got %+v", got[0])
	}
}

// A publish delay holds the key under Ordered.
func TestNotBeforeHoldsKey(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	s := e.sub("t", "s", policy.Ordered, nil)
	ctx := ctxT(t, 20*time.Second)
	d := msg("A", "a1")
	d.NotBefore = time.Now().Add(time.Second)
	sendBatch(t, tp, d)
	sendBatch(t, tp, msg("A", "a2"))
	sendBatch(t, tp, msg("B", "b1"))
	got := receiveN(t, ctx, s, 1)
	if got[0].ID != "b1" {
		t.Fatalf("got %s, want b1", got[0].ID)
	}
	start := time.Now()
	got = receiveN(t, ctx, s, 2)
	if el := time.Since(start); !slices.Equal(ids(got), []string{"a1", "a2"}) || el < 700*time.Millisecond {
		t.Fatalf("got %v after %v", ids(got), el)
	}
	if got[0].NotBefore.IsZero() {
		t.Fatal("NotBefore not carried")
	}
}

// An expired lease is reclaimed: the same message again, counted as an
// attempt, before its successors; the old holder can no longer extend or
// release the key.
func TestLeaseExpiry(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	opts := &postgres.Options{Lease: time.Second, ChainLength: 1}
	s1 := e.sub("t", "s", policy.Ordered, opts)
	s2 := e.sub("t", "s", policy.Ordered, opts)
	sendBatch(t, tp, msg("A", "a1"), msg("A", "a2"))
	ctx := ctxT(t, 20*time.Second)
	got := receiveN(t, ctx, s1, 1)
	if err := s1.Started(ctx, got); err != nil { // a1's handler runs
		t.Fatal(err)
	}
	s1.WaitStarted()
	lost, err := s1.ExtendLeases(ctx, got)
	if err != nil || len(lost) != 0 {
		t.Fatalf("extend: %v %v", lost, err)
	}
	again := receiveN(t, ctx, s2, 1) // blocks until the lease expires
	if again[0].ID != "a1" || again[0].Attempt != 2 {
		t.Fatalf("reclaimed %s attempt %d", again[0].ID, again[0].Attempt)
	}
	if lost, err := s1.ExtendLeases(ctx, got); err != nil || len(lost) != 1 {
		t.Fatalf("old lease not reported lost: %v %v", lost, err)
	}
	// The old holder's ack deletes nothing and does not release s2's hold.
	if err := s1.Ack(ctx, got); !errors.Is(err, postgres.ErrLeaseLost) {
		t.Fatalf("stale ack = %v, want ErrLeaseLost", err)
	}
	receiveNone(t, s1, 300*time.Millisecond)
	if err := s2.Ack(ctx, again); err != nil {
		t.Fatal(err)
	}
	if got := receiveN(t, ctx, s1, 1); got[0].ID != "a2" {
		t.Fatalf("got %s", got[0].ID)
	}
}

func TestDeadLetterAndRedrive(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	s := e.sub("t", "s", policy.Ordered, nil)
	other := e.sub("t", "other", policy.Parallel, nil)
	m := msg("A", "a1")
	m.Headers = map[string]string{"h": "v"}
	sendBatch(t, tp, m, msg("A", "a2"))
	ctx := ctxT(t, 20*time.Second)
	got := receiveN(t, ctx, s, 2)
	if err := s.DeadLetter(ctx, got[0], "boom", 3); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, got[1:]); err != nil {
		t.Fatal(err)
	}
	sendBatch(t, tp, msg("A", "a3"))
	next := receiveN(t, ctx, s, 2)
	if !slices.Equal(ids(next), []string{"a2", "a3"}) {
		t.Fatalf("after dead letter: %v", ids(next))
	}
	dls, err := s.DeadLetters(ctx, 10)
	if err != nil || len(dls) != 1 || dls[0].Message.ID != "a1" || dls[0].Reason != "boom" || dls[0].Attempts != 3 || dls[0].Message.Headers["h"] != "v" {
		t.Fatalf("dead letters %+v %v", dls, err)
	}
	n, err := s.Redrive(ctx, []string{"a1"})
	if err != nil || n != 1 {
		t.Fatalf("redrive %d %v", n, err)
	}
	if err := s.Ack(ctx, next); err != nil {
		t.Fatal(err)
	}
	re := receiveN(t, ctx, s, 1)
	if re[0].ID != "a1" || re[0].Attempt != 1 || string(re[0].Payload) != "a1" {
		t.Fatalf("redriven %+v", re[0])
	}
	if dls, _ := s.DeadLetters(ctx, 10); len(dls) != 0 {
		t.Fatalf("dead letters after redrive: %v", dls)
	}
	// The other subscription sees a1 once, not the redrive.
	all := receiveN(t, ctx, other, 3)
	if err := other.Ack(ctx, all); err != nil {
		t.Fatal(err)
	}
	receiveNone(t, other, 200*time.Millisecond)
}

func TestPublishTx(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	s := e.sub("t", "s", policy.Ordered, nil)
	ctx := ctxT(t, 20*time.Second)
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tp.PublishTx(ctx, tx, &keyorder.Message{Key: "A", Payload: []byte("rolled back")}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		return tp.PublishTx(ctx, tx,
			&keyorder.Message{Payload: []byte("x"), Headers: map[string]string{keyorder.HeaderPartitionKey: "A", "k": "v"}},
			&keyorder.Message{ID: "second", Key: "A", Payload: []byte("y")})
	})
	if err != nil {
		t.Fatal(err)
	}
	got := receiveN(t, ctx, s, 2)
	if got[0].Key != "A" || string(got[0].Payload) != "x" || got[0].ID == "" || got[0].Headers["k"] != "v" || got[1].ID != "second" {
		t.Fatalf("got %+v %+v", got[0], got[1])
	}
	if _, ok := got[0].Headers[keyorder.HeaderPartitionKey]; ok {
		t.Fatal("partition-key header kept")
	}
	err = pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		return tp.PublishTx(ctx, tx, &keyorder.Message{Payload: []byte("x")})
	})
	if !errors.Is(err, keyorder.ErrMissingKey) {
		t.Fatalf("keyless PublishTx: %v", err)
	}
}

func TestURL(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t, 20*time.Second)
	sep := "?"
	if strings.Contains(e.url, "?") {
		sep = "&"
	}
	base := e.url + sep + "schema=" + e.schema
	for _, bad := range []string{"&topic=t&bogus=1", "&topic=t&lease=soon", "&topic=t&ordering=random", "&topic=t&chain=-1"} {
		if _, err := driver.DefaultMux().OpenTopic(ctx, base+bad); !errors.Is(err, keyorder.ErrBadURL) && !errors.Is(err, keyorder.ErrInvalidConfig) {
			t.Errorf("%s: %v", bad, err)
		}
	}
	if _, err := driver.DefaultMux().OpenSubscription(ctx, base+"&topic=t"); !errors.Is(err, keyorder.ErrBadURL) {
		t.Errorf("missing subscription: %v", err)
	}
	sub, err := driver.DefaultMux().OpenSubscription(ctx, base+"&topic=ledger&subscription=apply&create=true&ordering=ordered&max_attempts=5&lease=5s&application_name=kotest")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if c := sub.Capabilities(); c.Ordering != policy.Ordered || !c.NativeHold || c.LeaseDuration != 5*time.Second {
		t.Fatalf("capabilities %+v", c)
	}
	if got := sub.(*postgres.Subscription).Settings().MaxAttempts; got != 5 {
		t.Fatalf("max attempts %d", got)
	}
	top, err := driver.DefaultMux().OpenTopic(ctx, "postgresql"+base[len("postgres"):]+"&topic=ledger")
	if err != nil {
		t.Fatal(err)
	}
	defer top.Close()
	if err := top.SendBatch(ctx, []*driver.Message{msg("A", "1")}); err != nil {
		t.Fatal(err)
	}
	got := receiveN(t, ctx, sub, 1)
	if err := sub.Ack(ctx, got); err != nil {
		t.Fatal(err)
	}
}

// Receive never returns more than asked, however chains and keyless
// messages add up, and the oldest come first.
func TestReceiveAtMostMax(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	s := e.sub("t", "s", policy.Ordered, nil)
	sendBatch(t, tp, msg("", "s0"))
	for _, k := range []string{"A", "B", "C"} {
		var ms []*driver.Message
		for i := range 10 {
			ms = append(ms, msg(k, fmt.Sprintf("%s%d", k, i)))
		}
		sendBatch(t, tp, ms...)
	}
	sendBatch(t, tp, msg("", "s1"), msg("", "s2"))
	ctx := ctxT(t, 20*time.Second)
	total := 0
	for total < 33 {
		ms, err := s.Receive(ctx, 15)
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) > 15 {
			t.Fatalf("Receive(15) returned %d", len(ms))
		}
		if total == 0 && ms[0].ID != "s0" {
			t.Fatalf("first receive starts with %s, want s0 (the oldest)", ms[0].ID)
		}
		total += len(ms)
		if err := s.Ack(ctx, ms); err != nil {
			t.Fatal(err)
		}
	}
	receiveNone(t, s, 100*time.Millisecond)
}

// Acks delete the bodies no subscription needs; Purge collects bodies left
// without deliveries (here: published while the topic had no subscription);
// DeleteSubscription removes a subscription with what it held.
func TestRetention(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t, 20*time.Second)
	tp := e.topic("t", nil)
	sendBatch(t, tp, msg("A", "orphan1"), msg("B", "orphan2"))
	s1 := e.sub("t", "s1", policy.Ordered, nil)
	s2 := e.sub("t", "s2", policy.Parallel, nil)
	sendBatch(t, tp, msg("A", "a1"), msg("A", "a2"))
	n, err := e.admin.Purge(ctx, "t")
	if err != nil || n != 2 {
		t.Fatalf("purge deleted %d (%v), want the 2 orphans", n, err)
	}
	got := receiveN(t, ctx, s1, 2)
	if err := s1.Ack(ctx, got); err != nil {
		t.Fatal(err)
	}
	st, err := s1.BackendStats(ctx)
	stored, serr := e.admin.StoredMessages(ctx, "t")
	if err != nil || serr != nil || stored != 2 || st.Pending != 0 || st.Keys != 0 {
		t.Fatalf("after s1 acked: %+v %v, %d stored (%v) (s2 still needs the bodies)", st, err, stored, serr)
	}
	got = receiveN(t, ctx, s2, 2)
	if err := s2.Ack(ctx, got); err != nil {
		t.Fatal(err)
	}
	if stored, err := e.admin.StoredMessages(ctx, "t"); err != nil || stored != 0 {
		t.Fatalf("after both acked: %d stored (%v)", stored, err)
	}
	sendBatch(t, tp, msg("A", "a3"))
	if err := e.admin.DeleteSubscription(ctx, "t", "s2"); err != nil {
		t.Fatal(err)
	}
	if _, err := postgres.OpenSubscriptionDriver(ctx, e.pool, "t", "s2", &postgres.Options{Schema: e.schema}); !errors.Is(err, keyorder.ErrNotFound) {
		t.Fatalf("deleted subscription: %v", err)
	}
}
