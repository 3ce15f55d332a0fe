package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// A consumer whose lease was lost settles nothing: its Ack or DeadLetter of
// a message another consumer has claimed since (and may be running) fails
// with ErrLeaseLost and leaves the delivery to that consumer, for a keyed
// chain (the head's token) and for a direct delivery (its own token). The
// new holder's settlement then lands, and a settlement by a consumer whose
// lease is still its own keeps working in the same call.
func TestStaleSettleLeaseLost(t *testing.T) {
	for _, ord := range []policy.Ordering{policy.Ordered, policy.Exclusive, policy.Parallel} {
		for _, op := range []string{"ack", "dead-letter"} {
			t.Run(fmt.Sprintf("%v/%s", ord, op), func(t *testing.T) {
				e := newEnv(t)
				tp := e.topic("t", nil)
				opts := &postgres.Options{LeaseDuration: time.Second, ChainLength: 1}
				stale := e.sub("t", "s", ord, opts)
				live := e.sub("t", "s", ord, opts)
				sendBatch(t, tp, msg("A", "a1"))
				ctx := ctxT(t, 20*time.Second)
				old := receiveN(t, ctx, stale, 1)
				if err := stale.Started(ctx, old); err != nil {
					t.Fatal(err)
				}
				stale.WaitStarted()
				sendBatch(t, tp, msg("B", "b1"))
				now := receiveN(t, ctx, live, 1) // b1, ready at once
				if now[0].ID != "b1" {
					t.Fatalf("live consumer got %s first, want b1", now[0].ID)
				}
				again := receiveN(t, ctx, live, 1) // a1, once the stale lease expired
				if again[0].ID != "a1" {
					t.Fatalf("reclaimed %s, want a1", again[0].ID)
				}
				var err error
				if op == "ack" {
					err = stale.Ack(ctx, old)
				} else {
					err = stale.DeadLetter(ctx, old[0], "stale", 1)
				}
				if n := e.pending(t, "a1"); n != 1 {
					t.Errorf("after the stale %s, a1 has %d deliveries, want 1: it was settled under the consumer running it", op, n)
				}
				if !errors.Is(err, postgres.ErrLeaseLost) {
					t.Fatalf("stale %s = %v, want ErrLeaseLost", op, err)
				}
				if dls, err := live.DeadLetters(ctx, 10); err != nil || len(dls) != 0 {
					t.Fatalf("dead letters after the stale %s: %v %v", op, dls, err)
				}
				// The new holder settles a1 and b1 in one call.
				if err := live.Ack(ctx, append(again, now...)); err != nil {
					t.Fatalf("live ack: %v", err)
				}
				if n := e.pending(t, "a1") + e.pending(t, "b1"); n != 0 {
					t.Fatalf("%d deliveries left after the live ack, want 0", n)
				}
			})
		}
	}
}

// A stale ack of two messages, one still leased to this consumer and one
// claimed by another since: the first is acknowledged, the second is left
// and named in the ErrLeaseLost error.
func TestStaleAckPartial(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	opts := &postgres.Options{LeaseDuration: 30 * time.Second, ChainLength: 1}
	a := e.sub("t", "s", policy.Ordered, opts)
	b := e.sub("t", "s", policy.Ordered, opts)
	sendBatch(t, tp, msg("A", "a1"), msg("B", "b1"))
	ctx := ctxT(t, 20*time.Second)
	got := receiveN(t, ctx, a, 2)
	var ka, kb []*driver.Message
	for _, m := range got {
		if m.Key == "A" {
			ka = append(ka, m)
		} else {
			kb = append(kb, m)
		}
	}
	e.expire(t, "B") // B's lease runs out; A's is still a's
	taken := receiveN(t, ctx, b, 1)
	if taken[0].ID != "b1" {
		t.Fatalf("reclaimed %s, want b1", taken[0].ID)
	}
	err := a.Ack(ctx, append(ka, kb...))
	if !errors.Is(err, postgres.ErrLeaseLost) || !containsAll(err.Error(), "b1", "1 of 2") {
		t.Fatalf("ack = %v, want ErrLeaseLost naming b1, 1 of 2", err)
	}
	if na, nb := e.pending(t, "a1"), e.pending(t, "b1"); na != 0 || nb != 1 {
		t.Fatalf("after the ack: a1 %d deliveries (want 0), b1 %d (want 1)", na, nb)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

// pending counts the deliveries of the message with this ID.
func (e *env) pending(t *testing.T, id string) int {
	t.Helper()
	var n int
	err := e.pool.QueryRow(context.Background(), fmt.Sprintf(
		"SELECT count(*) FROM %[1]s.deliveries d JOIN %[1]s.messages m ON m.id = d.id WHERE m.msg_id = $1", e.schema), id).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// expire makes the lease of key's head run out now.
func (e *env) expire(t *testing.T, key string) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), fmt.Sprintf(
		"UPDATE %s.heads SET claimable_at = now() - interval '1 second' WHERE msg_key = $1", e.schema), key); err != nil {
		t.Fatal(err)
	}
}
