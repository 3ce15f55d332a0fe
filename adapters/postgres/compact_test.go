package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// compactSub opens a consumer of a compacting subscription (created on first
// use) with the given lease.
func (e *env) compactSub(topic string, ordering policy.Ordering, lease time.Duration) *postgres.Subscription {
	e.t.Helper()
	o := e.opts(&postgres.Options{Create: true, Lease: lease,
		Subscription: &postgres.SubscriptionOptions{Ordering: ordering, Compaction: true}})
	s, err := postgres.OpenSubscriptionDriver(context.Background(), e.pool, topic, "sub", o)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { s.Close() })
	return s
}

func send(t *testing.T, tp *postgres.Topic, ms ...*driver.Message) {
	t.Helper()
	if err := tp.SendBatch(context.Background(), ms); err != nil {
		t.Fatal(err)
	}
}

func stats(t *testing.T, s *postgres.Subscription) keyorder.BackendStats {
	t.Helper()
	st, err := s.BackendStats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

var compactPolicies = []policy.Ordering{policy.Exclusive, policy.Parallel}

// A backlog is resolved to the newest message of each key; the others are
// superseded, counted and gone (not dead letters).
func TestCompactDeliversNewest(t *testing.T) {
	for _, ord := range compactPolicies {
		t.Run(ord.String(), func(t *testing.T) {
			e := newEnv(t)
			tp := e.topic("t", nil)
			s := e.compactSub("t", ord, 0)
			send(t, tp, msg("A", "a1"), msg("A", "a2"), msg("B", "b1"), msg("A", "a3"), msg("B", "b2"))
			send(t, tp, &driver.Message{ID: "n1", Payload: []byte("n1")}) // keyless: never superseded
			ctx := ctxT(t, 30*time.Second)
			got := receiveN(t, ctx, s, 3)
			gotIDs := ids(got)
			slices.Sort(gotIDs)
			if !slices.Equal(gotIDs, []string{"a3", "b2", "n1"}) {
				t.Fatalf("received %v, want a3 b2 n1", gotIDs)
			}
			if st := stats(t, s); st.Superseded != 3 || st.Pending != 3 || st.Dead != 0 {
				t.Fatalf("stats %+v, want 3 superseded, 3 pending, 0 dead", st)
			}
			if err := s.Ack(ctx, got); err != nil {
				t.Fatal(err)
			}
			receiveNone(t, s, 300*time.Millisecond)
			if st := stats(t, s); st.Pending != 0 || st.Superseded != 3 {
				t.Fatalf("stats %+v after ack", st)
			}
			n, err := e.admin.StoredMessages(ctx, "t")
			if err != nil || n != 0 {
				t.Fatalf("stored message bodies %d (%v), want 0: superseded bodies are deleted", n, err)
			}
		})
	}
}

// A message in flight is never superseded: newer messages wait (Exclusive)
// or run beside it (Parallel), and the in-flight one is acknowledged
// normally.
func TestCompactInFlightNotSuperseded(t *testing.T) {
	for _, ord := range compactPolicies {
		t.Run(ord.String(), func(t *testing.T) {
			e := newEnv(t)
			tp := e.topic("t", nil)
			s := e.compactSub("t", ord, 0)
			ctx := ctxT(t, 30*time.Second)
			send(t, tp, msg("A", "a1"))
			first := receiveN(t, ctx, s, 1)
			send(t, tp, msg("A", "a2"))
			send(t, tp, msg("A", "a3"))
			send(t, tp, msg("A", "a4"))
			if ord == policy.Exclusive {
				receiveNone(t, s, 300*time.Millisecond)
				if err := s.Ack(ctx, first); err != nil {
					t.Fatal(err)
				}
			}
			got := receiveN(t, ctx, s, 1)
			if got[0].ID != "a4" {
				t.Fatalf("received %s, want a4", got[0].ID)
			}
			if ord == policy.Parallel {
				// a1 is still in flight beside a4, and acknowledged as usual.
				if st := stats(t, s); st.Pending != 2 {
					t.Fatalf("stats %+v: the in-flight a1 must still be pending", st)
				}
				if err := s.Ack(ctx, first); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Ack(ctx, got); err != nil {
				t.Fatal(err)
			}
			if st := stats(t, s); st.Superseded != 2 || st.Pending != 0 {
				t.Fatalf("stats %+v, want a2 and a3 superseded, nothing pending", st)
			}
		})
	}
}

// A failed message waiting for its retry is superseded by a newer one; with
// no newer one it is retried as usual.
func TestCompactRetryingSuperseded(t *testing.T) {
	for _, ord := range compactPolicies {
		t.Run(ord.String(), func(t *testing.T) {
			e := newEnv(t)
			tp := e.topic("t", nil)
			s := e.compactSub("t", ord, 0)
			ctx := ctxT(t, 30*time.Second)
			send(t, tp, msg("A", "a1"), msg("B", "b1"))
			got := receiveN(t, ctx, s, 2)
			for _, m := range got {
				delay := time.Hour // a1 waits for its retry
				if m.ID == "b1" {
					delay = 0 // b1 is due again at once
				}
				if err := s.Nack(ctx, m, delay); err != nil {
					t.Fatal(err)
				}
			}
			send(t, tp, msg("A", "a2"))
			got = receiveN(t, ctx, s, 2)
			byID := map[string]int{}
			for _, m := range got {
				byID[m.ID] = m.Attempt
			}
			// a2 supersedes the retrying a1; b1 has nothing newer: retried.
			if len(byID) != 2 || byID["a2"] != 1 || byID["b1"] != 2 {
				t.Fatalf("received %v (id: attempt), want a2: 1 and b1: 2", byID)
			}
			if err := s.Ack(ctx, got); err != nil {
				t.Fatal(err)
			}
			if st := stats(t, s); st.Superseded != 1 || st.Pending != 0 || st.Dead != 0 {
				t.Fatalf("stats %+v, want a1 superseded, nothing pending", st)
			}
		})
	}
}

// A message with a not-before time newer than a ready one does not
// supersede it before it is due; an older delayed one is superseded by a
// newer ready one.
func TestCompactNotBefore(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	s := e.compactSub("t", policy.Exclusive, 0)
	ctx := ctxT(t, 30*time.Second)
	later := &driver.Message{ID: "a0", Key: "A", Payload: []byte("x"), NotBefore: time.Now().Add(time.Hour)}
	send(t, tp, later, msg("A", "a1"))
	delayed := &driver.Message{ID: "a2", Key: "A", Payload: []byte("x"), NotBefore: time.Now().Add(time.Hour)}
	send(t, tp, delayed)
	m := receiveN(t, ctx, s, 1)[0]
	if m.ID != "a1" {
		t.Fatalf("received %s, want a1 (a0 older and superseded, a2 not due)", m.ID)
	}
	if err := s.Ack(ctx, []*driver.Message{m}); err != nil {
		t.Fatal(err)
	}
	receiveNone(t, s, 300*time.Millisecond)
	if st := stats(t, s); st.Superseded != 1 || st.Pending != 1 {
		t.Fatalf("stats %+v, want a0 superseded and a2 pending until due", st)
	}
}

// A consumer that loses its lease loses its message to compaction when a
// newer one is waiting; its late Ack and Nack change nothing. With nothing
// newer, the message is redelivered with the lost attempt counted.
func TestCompactLeaseLost(t *testing.T) {
	for _, ord := range compactPolicies {
		t.Run(ord.String(), func(t *testing.T) {
			e := newEnv(t)
			tp := e.topic("t", nil)
			dead := e.compactSub("t", ord, time.Second)
			live := e.compactSub("t", ord, time.Second)
			ctx := ctxT(t, 30*time.Second)
			send(t, tp, msg("A", "a1"), msg("B", "b1"))
			lost := receiveN(t, ctx, dead, 2)               // then the consumer stops renewing
			if err := dead.Started(ctx, lost); err != nil { // its handlers run
				t.Fatal(err)
			}
			dead.WaitStarted()
			send(t, tp, msg("A", "a2"))
			var got []*driver.Message
			for len(got) < 2 {
				got = append(got, receiveN(t, ctx, live, 1)...)
			}
			byID := map[string]*driver.Message{}
			for _, m := range got {
				byID[m.ID] = m
			}
			if byID["a2"] == nil || byID["b1"] == nil {
				t.Fatalf("received %v, want a2 and b1", ids(got))
			}
			if a := byID["b1"].Attempt; a != 2 {
				t.Fatalf("b1 attempt %d, want 2 (the lost lease counts)", a)
			}
			// The stale consumer's settlements change nothing.
			for _, m := range lost {
				if m.ID == "a1" {
					if err := dead.Nack(ctx, m, 0); err != nil {
						t.Fatal(err)
					}
					if err := dead.Ack(ctx, []*driver.Message{m}); !errors.Is(err, postgres.ErrLeaseLost) {
						t.Fatalf("stale ack = %v, want ErrLeaseLost", err)
					}
				}
			}
			if err := live.Ack(ctx, got); err != nil {
				t.Fatal(err)
			}
			receiveNone(t, live, 300*time.Millisecond)
			if st := stats(t, live); st.Superseded != 1 || st.Pending != 0 {
				t.Fatalf("stats %+v, want a1 superseded, nothing pending", st)
			}
		})
	}
}

// Ordered refuses compaction with a typed error naming both; an existing
// subscription cannot be reopened with another compaction setting.
func TestCompactRefusedUnderOrdered(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t, 30*time.Second)
	err := e.admin.CreateSubscription(ctx, "t", "s", &postgres.SubscriptionOptions{Ordering: policy.Ordered, Compaction: true})
	if !errors.Is(err, keyorder.ErrInvalidConfig) || !strings.Contains(err.Error(), "Compaction") || !strings.Contains(err.Error(), "Ordered") {
		t.Fatalf("err = %v, want ErrInvalidConfig naming Compaction and Ordered", err)
	}
	if err := e.admin.CreateSubscription(ctx, "t", "x", &postgres.SubscriptionOptions{Ordering: policy.Exclusive, Compaction: true}); err != nil {
		t.Fatal(err)
	}
	err = e.admin.CreateSubscription(ctx, "t", "x", &postgres.SubscriptionOptions{Ordering: policy.Exclusive})
	if !errors.Is(err, keyorder.ErrInvalidConfig) {
		t.Fatalf("reopening without compaction: err = %v, want ErrInvalidConfig", err)
	}
	// The schema refuses it too, whatever writes the row.
	_, err = e.pool.Exec(ctx, "UPDATE "+e.schema+".subscriptions SET ordering = 2 WHERE name = 'x'")
	if err == nil {
		t.Fatal("the schema accepted an Ordered compacting subscription")
	}
}

// Concurrent publishers and consumers: the newest message of every key is
// delivered, every message is either delivered or superseded, and (under
// Exclusive) no key ever sees an older message after a newer one.
func TestCompactConcurrentPublishersAndConsumers(t *testing.T) {
	for _, ord := range compactPolicies {
		t.Run(ord.String(), func(t *testing.T) {
			const keys, versions, publishers, consumers = 20, 30, 4, 3
			e := newEnv(t)
			tp := e.topic("t", nil)
			subs := make([]*postgres.Subscription, consumers)
			for i := range subs {
				subs[i] = e.compactSub("t", ord, 0)
			}
			ctx := ctxT(t, 2*time.Minute)
			var mu sync.Mutex
			last := map[string]int{}  // newest version received per key
			acked := map[string]int{} // newest version acknowledged per key
			delivered := 0
			var problems []string
			done := make(chan struct{})
			var wg sync.WaitGroup
			for _, s := range subs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
						ms, err := s.Receive(rctx, 5)
						cancel()
						if err != nil {
							select {
							case <-done:
								return
							default:
								continue
							}
						}
						for _, m := range ms {
							v, _ := strconv.Atoi(string(m.Payload))
							mu.Lock()
							delivered++
							if ord == policy.Exclusive && v < last[m.Key] { // a retry repeats a version
								problems = append(problems, fmt.Sprintf("key %s: version %d after %d", m.Key, v, last[m.Key]))
							}
							// Parallel: claims of one key run side by side, so the
							// order in which their Receive calls return says
							// nothing (a claim that began before the newer
							// message existed may return after it was acked).
							if ord == policy.Exclusive && v <= acked[m.Key] {
								problems = append(problems, fmt.Sprintf("key %s: version %d after %d was acknowledged", m.Key, v, acked[m.Key]))
							}
							last[m.Key] = max(last[m.Key], v)
							mu.Unlock()
							time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
							if rand.IntN(10) == 0 {
								if err := s.Nack(ctx, m, 20*time.Millisecond); err != nil {
									t.Error(err)
								}
								continue
							}
							if err := s.Ack(ctx, []*driver.Message{m}); err != nil {
								t.Error(err)
							}
							mu.Lock()
							acked[m.Key] = max(acked[m.Key], v)
							mu.Unlock()
						}
					}
				}()
			}
			// Each publisher owns keys i, i+publishers, ...: a key's versions
			// are published in order, one or a few per publish.
			var pw sync.WaitGroup
			for p := range publishers {
				pw.Add(1)
				go func() {
					defer pw.Done()
					for v := 1; v <= versions; {
						for k := p; k < keys; k += publishers {
							var ms []*driver.Message
							for j := v; j < v+2 && j <= versions; j++ {
								ms = append(ms, &driver.Message{ID: fmt.Sprintf("k%d-%d", k, j), Key: fmt.Sprintf("k%d", k), Payload: []byte(strconv.Itoa(j))})
							}
							batches := [][]*driver.Message{ms}
							if rand.IntN(2) == 0 && len(ms) == 2 {
								batches = [][]*driver.Message{ms[:1], ms[1:]}
							}
							for _, b := range batches {
								if err := tp.SendBatch(ctx, b); err != nil {
									t.Error(err)
									return
								}
							}
						}
						v += 2
					}
				}()
			}
			pw.Wait()
			// Wait until every key's newest version is acknowledged.
			for {
				mu.Lock()
				n := 0
				for _, v := range acked {
					if v == versions {
						n++
					}
				}
				mu.Unlock()
				if n == keys && stats(t, subs[0]).Pending == 0 {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("only %d of %d keys reached version %d", n, keys, versions)
				}
				time.Sleep(50 * time.Millisecond)
			}
			close(done)
			wg.Wait()
			st := stats(t, subs[0])
			if len(problems) > 0 {
				t.Fatalf("%d order problems, first: %v", len(problems), problems[:min(5, len(problems))])
			}
			t.Logf("%s: %d published, %d deliveries (retries included), %d superseded", ord, keys*versions, delivered, st.Superseded)
			if st.Superseded == 0 || st.Superseded >= int64(keys*versions) {
				t.Fatalf("superseded %d of %d", st.Superseded, keys*versions)
			}
		})
	}
}

// A publish racing the claim: while a publisher of the key holds its
// transaction open (it holds the key's head), the claim skips the key and
// supersedes nothing; once it commits, its message is the newest and the
// only one delivered.
func TestCompactPublishRacingClaim(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	s := e.compactSub("t", policy.Exclusive, 0)
	ctx := ctxT(t, 30*time.Second)
	send(t, tp, msg("A", "a1"), msg("A", "a2"), msg("B", "b1"))
	ob, err := postgres.OpenOutbox(ctx, e.pool, "t", e.opts(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := ob.PublishTx(ctx, tx, &keyorder.Message{ID: "a3", Key: "A", Payload: []byte("a3")}); err != nil {
		t.Fatal(err)
	}
	// Only B is claimable while the publisher of A is open.
	m := receiveN(t, ctx, s, 1)[0]
	if m.ID != "b1" {
		t.Fatalf("received %s, want b1 (A is locked by its publisher)", m.ID)
	}
	receiveNone(t, s, 300*time.Millisecond)
	if st := stats(t, s); st.Superseded != 0 {
		t.Fatalf("stats %+v: nothing may be superseded while the key's publisher is open", st)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	m = receiveN(t, ctx, s, 1)[0]
	if m.ID != "a3" {
		t.Fatalf("received %s, want a3 (the newest, committed after the claim began)", m.ID)
	}
	if st := stats(t, s); st.Superseded != 2 {
		t.Fatalf("stats %+v, want a1 and a2 superseded", st)
	}
}

// A claim whose transaction is rolled back (a connection lost before the
// claim commits) supersedes nothing: the messages are all there and the
// next claim compacts them again.
func TestCompactClaimRolledBack(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	s := e.compactSub("t", policy.Exclusive, 0)
	ctx := ctxT(t, 30*time.Second)
	send(t, tp, msg("A", "a1"), msg("A", "a2"), msg("A", "a3"))
	// Run the claim in a transaction that is rolled back, as a claim whose
	// connection is lost before commit would be.
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var sub, topic int32
	if err := tx.QueryRow(ctx, "SELECT s.id, s.topic_id FROM "+e.schema+".subscriptions s WHERE s.name = 'sub'").Scan(&sub, &topic); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, "SELECT msg_id FROM "+e.schema+".claim_keys_compact($1, $2, 10, '30s', 42)", sub, topic)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		got = append(got, id)
	}
	if err := rows.Err(); err != nil || !slices.Equal(got, []string{"a3"}) {
		t.Fatalf("claim in tx: %v %v, want a3", got, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if st := stats(t, s); st.Superseded != 0 || st.Pending != 3 {
		t.Fatalf("stats %+v after a rolled-back claim: want nothing superseded, 3 pending", st)
	}
	m := receiveN(t, ctx, s, 1)[0]
	if m.ID != "a3" || m.Attempt != 1 {
		t.Fatalf("received %s attempt %d, want a3 attempt 1", m.ID, m.Attempt)
	}
	if st := stats(t, s); st.Superseded != 2 {
		t.Fatalf("stats %+v, want 2 superseded", st)
	}
}

// Parallel: a message that fails while a newer message of its key is
// pending or in flight is superseded at once instead of retried; without a
// newer one it is retried.
func TestCompactParallelNackWithNewer(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	s := e.compactSub("t", policy.Parallel, 0)
	ctx := ctxT(t, 30*time.Second)
	send(t, tp, msg("A", "a1"))
	a1 := receiveN(t, ctx, s, 1)[0]
	send(t, tp, msg("A", "a2"))
	a2 := receiveN(t, ctx, s, 1)[0] // in flight beside a1
	if a2.ID != "a2" {
		t.Fatalf("received %s, want a2", a2.ID)
	}
	if err := s.Nack(ctx, a1, 0); err != nil {
		t.Fatal(err)
	}
	if st := stats(t, s); st.Superseded != 1 || st.Pending != 1 {
		t.Fatalf("stats %+v: a1 failed with a2 in flight, want it superseded", st)
	}
	if err := s.Nack(ctx, a2, 0); err != nil {
		t.Fatal(err)
	}
	m := receiveN(t, ctx, s, 1)[0]
	if m.ID != "a2" || m.Attempt != 2 {
		t.Fatalf("received %s attempt %d, want a2 retried (nothing newer)", m.ID, m.Attempt)
	}
}

// A compacting Parallel subscription gets a partial index of its own (no
// other subscription's publishes maintain it); deleting the subscription
// or migrating below 003 drops it.
func TestCompactParallelIndex(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t, 30*time.Second)
	count := func() int {
		var n int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexname LIKE 'deliveries\_compact\_%'`, e.schema).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, name := range []string{"p1", "p2"} {
		if err := e.admin.CreateSubscription(ctx, "t", name, &postgres.SubscriptionOptions{Ordering: policy.Parallel, Compaction: true}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.admin.CreateSubscription(ctx, "t", "p1", &postgres.SubscriptionOptions{Ordering: policy.Parallel, Compaction: true}); err != nil {
		t.Fatal(err) // reopening finds the index
	}
	if err := e.admin.CreateSubscription(ctx, "t", "x", &postgres.SubscriptionOptions{Ordering: policy.Exclusive, Compaction: true}); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 2 {
		t.Fatalf("%d compaction indexes, want 2 (one per compacting Parallel subscription)", n)
	}
	if err := e.admin.DeleteSubscription(ctx, "t", "p1"); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 1 {
		t.Fatalf("%d compaction indexes after deleting one subscription, want 1", n)
	}
	// Down 005, 004 and 003.
	if _, err := postgres.Migrate(ctx, e.pool, postgres.DirectionDown, &postgres.MigrateOptions{Schema: e.schema, Steps: 3}); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 0 {
		t.Fatalf("%d compaction indexes below migration 003, want 0", n)
	}
}

// A consumer process killed with SIGKILL while it runs a compacted key's
// newest message: newer updates published meanwhile wait for the lease; when
// it expires the key is compacted again, the dead process's message with
// the rest (it lost the key with its lease), and only the newest runs.
func TestCompactProcessKilled(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	ctx := ctxT(t, 60*time.Second)
	if err := e.admin.CreateSubscription(ctx, "t", "s", &postgres.SubscriptionOptions{Ordering: policy.Exclusive, Compaction: true}); err != nil {
		t.Fatal(err)
	}
	send(t, tp, msg("A", "a1"), msg("A", "a2"), msg("A", "a3"))
	h := startHelper(t, e, "t", 2*time.Second, 0, "a3")
	waitUntil(t, 30*time.Second, "the helper to start handling a3", func() bool {
		rs := h.read(t, 0)
		return len(rs) > 0 && rs[len(rs)-1].start && rs[len(rs)-1].id == "a3"
	})
	if rs := h.read(t, 0); len(rs) != 1 {
		t.Fatalf("the helper handled %v, want only a3 (a1 and a2 superseded)", rs)
	}
	send(t, tp, msg("A", "a4"), msg("A", "a5"))
	h.kill()
	o := e.opts(&postgres.Options{Lease: 2 * time.Second})
	s, err := postgres.OpenSubscriptionDriver(ctx, e.pool, "t", "s", o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m := receiveN(t, ctx, s, 1)[0]
	if m.ID != "a5" || m.Attempt != 1 {
		t.Fatalf("after the kill received %s attempt %d, want a5 attempt 1", m.ID, m.Attempt)
	}
	if err := s.Ack(ctx, []*driver.Message{m}); err != nil {
		t.Fatal(err)
	}
	if st := stats(t, s); st.Superseded != 4 || st.Pending != 0 || st.Dead != 0 {
		t.Fatalf("stats %+v, want a1-a4 superseded, nothing pending or dead", st)
	}
}
