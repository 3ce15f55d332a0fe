package postgres_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// Trap 1: a publish that commits while the key's last message is being
// acknowledged must not leave the key without a head. Publishers and
// consumers race on a few keys, every message alone in its chain, so that
// almost every ack releases (and usually deletes) a head while a publisher
// is adding to it. A lost head strands its key's messages and the consumers
// never finish. Without the lock-then-read release (sqlLockRelease before
// sqlRelease) this fails within a few hundred rounds.
func TestTrap1PublishDuringLastAck(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", &postgres.Options{NotifyDebounce: -1})
	const keys, rounds, consumers = 8, 150, 3
	ctx := ctxT(t, 20*time.Second)
	var received atomic.Int64
	var wg sync.WaitGroup
	var pubDone sync.WaitGroup
	var subs []*postgres.Subscription
	for range consumers {
		subs = append(subs, e.sub("t", "s", policy.Ordered, &postgres.Options{ChainLength: 1, PollInterval: 20 * time.Millisecond}))
	}
	for k := range keys {
		pubDone.Go(func() {
			// Outbox-style publishes: the business transaction goes on for
			// a moment after the enqueue, which widens the window in which
			// a consumer acks the key's last message.
			for r := range rounds {
				err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
					m := &keyorder.Message{ID: fmt.Sprintf("%d-%d", k, r), Key: "k" + strconv.Itoa(k), Payload: []byte("x")}
					if err := tp.PublishTx(ctx, tx, m); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, "SELECT pg_sleep(0.002)")
					return err
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for _, s := range subs {
		wg.Go(func() {
			for received.Load() < keys*rounds && ctx.Err() == nil {
				rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				ms, err := s.Receive(rctx, 10)
				cancel()
				if err != nil {
					continue
				}
				if err := s.Ack(ctx, ms); err != nil {
					t.Error(err)
					return
				}
				received.Add(int64(len(ms)))
			}
		})
	}
	pubDone.Wait()
	wg.Wait()
	if n := received.Load(); n != keys*rounds {
		var stranded int
		_ = e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.schema+`.deliveries d WHERE NOT EXISTS
			(SELECT 1 FROM `+e.schema+`.heads h WHERE h.sub_id = d.sub_id AND h.msg_key = d.msg_key AND h.claimable_at < 'infinity')`).Scan(&stranded)
		t.Fatalf("received %d of %d; %d deliveries have no claimable head", n, keys*rounds, stranded)
	}
}

// Trap 2: ids are drawn before commit, so two publishers of one key could
// commit out of id order and a consumer would run the later id first. The
// publish locks the key's head rows before drawing ids: a second publisher
// of the key waits for the first to commit. The test holds the first
// transaction open, waits until the second is seen blocked on the lock (it
// fails if the second commits instead), checks that the blocked one has not
// drawn an id yet (it fails if ids are drawn before the lock), then checks
// the consumer gets them in id order.
func TestTrap2ConcurrentPublishersOfOneKey(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	s := e.sub("t", "s", policy.Ordered, nil)
	ctx := ctxT(t, 30*time.Second)

	tx1, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback(ctx)
	if err := tp.PublishTx(ctx, tx1, &keyorder.Message{ID: "first", Key: "K", Payload: []byte("1")}); err != nil {
		t.Fatal(err)
	}

	// The id the first publisher drew: the sequence's position now.
	lastID := func() int64 {
		var v int64
		if err := e.pool.QueryRow(ctx, `SELECT last_value FROM `+
			`pg_catalog.pg_sequences WHERE schemaname = $1 AND sequencename = 'messages_id_seq'`, e.schema).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	firstID := lastID()
	pid := make(chan uint32, 1)
	second := make(chan error, 1)
	go func() {
		second <- pgx.BeginFunc(ctx, e.pool, func(tx2 pgx.Tx) error {
			var p uint32
			if err := tx2.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&p); err != nil {
				return err
			}
			pid <- p
			return tp.PublishTx(ctx, tx2, &keyorder.Message{ID: "second", Key: "K", Payload: []byte("2")})
		})
	}()
	p := <-pid
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for waiting := false; !waiting; {
		select {
		case err := <-second:
			t.Fatalf("the second publisher of K committed (%v) while the first was still open: publishes of a key are not serialized", err)
		case <-ctx.Done():
			t.Fatal("timed out waiting for the second publisher to block")
		case <-tick.C:
			var wt *string
			if err := e.pool.QueryRow(ctx, `SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1`, p).Scan(&wt); err != nil {
				t.Fatal(err)
			}
			waiting = wt != nil && *wt == "Lock"
		}
	}
	// Blocked before drawing an id: a publisher that drew its id first and
	// locked after could still commit before an earlier id of its key.
	if got := lastID(); got != firstID {
		t.Fatalf("the blocked second publisher already drew id %d (first: %d): ids must be drawn under the key's lock", got, firstID)
	}
	// Nothing of K is claimable while its first publisher is open.
	receiveNone(t, s, 100*time.Millisecond)
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	got := receiveN(t, ctx, s, 2)
	if !slices.Equal(ids(got), []string{"first", "second"}) {
		t.Fatalf("consumer got %v", ids(got))
	}
}

// Several consumers (each its own Subscription, as separate processes
// would be) compete on one Ordered subscription while handlers fail at
// random. Checked from the handlers' records: per key at most one message in
// flight, a failed message is the next one handled for its key, and the acked
// sequence of each key is its publish order.
func TestOrderedCompetingConsumers(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", &postgres.Options{NotifyDebounce: time.Millisecond})
	const keys, perKey, consumers = 40, 25, 4
	var subs []*postgres.Subscription
	for range consumers {
		subs = append(subs, e.sub("t", "s", policy.Ordered, &postgres.Options{PollInterval: 20 * time.Millisecond, MaxBatch: 20}))
	}
	for r := range perKey {
		var batch []*driver.Message
		for k := range keys {
			batch = append(batch, msg("k"+strconv.Itoa(k), fmt.Sprintf("%d", r)))
		}
		sendBatch(t, tp, batch...)
	}
	ctx := ctxT(t, 20*time.Second)
	type rec struct {
		start, end time.Time
		seq        int
		ok         bool
	}
	var mu sync.Mutex
	records := map[string][]rec{}
	var acked atomic.Int64
	var wg sync.WaitGroup
	for c, s := range subs {
		rng := rand.New(rand.NewPCG(uint64(c), 7))
		wg.Go(func() {
			for acked.Load() < keys*perKey && ctx.Err() == nil {
				rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				ms, err := s.Receive(rctx, 20)
				cancel()
				if err != nil {
					continue
				}
				// Run each chain in order; on failure release the rest.
				for i := 0; i < len(ms); {
					j := i
					for j < len(ms) && ms[j].Key == ms[i].Key {
						j++
					}
					for n, m := range ms[i:j] {
						seq, _ := strconv.Atoi(m.ID)
						r := rec{start: time.Now(), seq: seq}
						time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
						r.ok = rng.IntN(10) > 0
						r.end = time.Now()
						mu.Lock()
						records[m.Key] = append(records[m.Key], r)
						mu.Unlock()
						if r.ok {
							if err := s.Ack(ctx, []*driver.Message{m}); err != nil {
								t.Error(err)
								return
							}
							acked.Add(1)
							continue
						}
						if err := s.Nack(ctx, m, time.Duration(rng.IntN(20))*time.Millisecond); err != nil {
							t.Error(err)
							return
						}
						if rest := ms[i+n+1 : j]; len(rest) > 0 {
							if err := s.Release(ctx, rest); err != nil {
								t.Error(err)
								return
							}
						}
						break
					}
					i = j
				}
			}
		})
	}
	wg.Wait()
	if n := acked.Load(); n != keys*perKey {
		t.Fatalf("acked %d of %d", n, keys*perKey)
	}
	for key, rs := range records {
		slices.SortFunc(rs, func(a, b rec) int { return a.start.Compare(b.start) })
		next := 0
		for i, r := range rs {
			if i > 0 && r.start.Before(rs[i-1].end) {
				t.Fatalf("key %s: two messages in flight at once (%d and %d)", key, rs[i-1].seq, r.seq)
			}
			if r.seq != next {
				t.Fatalf("key %s: handled %d, expected %d (records %+v)", key, r.seq, next, rs)
			}
			if r.ok {
				next++
			}
		}
	}
}

// Trap 1, deterministically: a publisher of key K holds its transaction open
// while the consumer acknowledges K's last message, so the release must wait
// for it. Once the publisher commits, K's new message must be claimable. A
// release that read K's messages with a snapshot taken before it waited
// would find none, drop the head, and strand the message.
func TestTrap1AckWaitsForOpenPublisher(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	s := e.sub("t", "s", policy.Ordered, nil)
	ctx := ctxT(t, 30*time.Second)
	sendBatch(t, tp, msg("K", "k1"))
	got := receiveN(t, ctx, s, 1)

	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var txPid uint32
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&txPid); err != nil {
		t.Fatal(err)
	}
	if err := tp.PublishTx(ctx, tx, &keyorder.Message{ID: "k2", Key: "K", Payload: []byte("2")}); err != nil {
		t.Fatal(err)
	}
	acked := make(chan error, 1)
	go func() { acked <- s.Ack(ctx, got) }()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for blocked := false; !blocked; {
		select {
		case err := <-acked:
			t.Fatalf("the ack finished (%v) while a publisher of its key was open: the release did not wait for the head lock", err)
		case <-ctx.Done():
			t.Fatal("timed out waiting for the ack to block on the head lock")
		case <-tick.C:
			var n int
			if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE pid <> $1 AND wait_event_type = 'Lock' AND query LIKE '%heads%'`, txPid).Scan(&n); err != nil {
				t.Fatal(err)
			}
			blocked = n > 0
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-acked; err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	next, err := s.Receive(rctx, 10)
	if err != nil || len(next) != 1 || next[0].ID != "k2" {
		var heads int
		_ = e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.schema+`.heads`).Scan(&heads)
		t.Fatalf("after the publisher committed: %v, %v (heads: %d); k2 is stranded", ids(next), err, heads)
	}
}
