package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// attemptsOf lists ms as "id@attempt".
func attemptsOf(ms []*driver.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = fmt.Sprintf("%s@%d", m.ID, m.Attempt)
	}
	return out
}

// A chain whose lease is lost with no start recorded comes back uncounted,
// its head suspect: Started then writes the head's mark before it returns,
// so the next lost lease counts it. A head lost unmarked three times is
// counted anyway (the backstop for marks that never land). Members behind
// the head never count.
func TestLostLeaseUnmarked(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	s := e.sub("t", "s", policy.Ordered, &postgres.Options{Lease: time.Second, PollInterval: 50 * time.Millisecond})
	sendBatch(t, tp, msg("A", "a1"), msg("A", "a2"))
	ctx := ctxT(t, 60*time.Second)
	marked := func() bool {
		var ok bool
		if err := e.pool.QueryRow(ctx, "SELECT started_end IS NOT NULL FROM "+e.schema+".heads WHERE msg_key = 'A'").Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	// Each receive below waits for the previous claim's lease to expire.
	steps := []struct {
		start bool // record a1's start (its handler runs)
		want  []string
	}{
		{false, []string{"a1@1", "a2@1"}}, // claimed, never started
		{true, []string{"a1@1", "a2@1"}},  // not counted; a1 is now suspect
		{false, []string{"a1@2", "a2@1"}}, // a1 ran: counted
		{false, []string{"a1@2", "a2@1"}}, // second unmarked loss: not counted
		{false, []string{"a1@3", "a2@1"}}, // third: counted (backstop)
	}
	for i, st := range steps {
		got := receiveN(t, ctx, s, 2)
		if a := attemptsOf(got); !slices.Equal(a, st.want) {
			t.Fatalf("claim %d: got %v, want %v", i+1, a, st.want)
		}
		if st.start {
			// Suspect: written before Started returns, no WaitStarted.
			if err := s.Started(ctx, got[:1]); err != nil {
				t.Fatal(err)
			}
			if !marked() {
				t.Fatalf("claim %d: Started returned before the suspect a1's mark was written", i+1)
			}
		}
	}
}

// A batch's members start together: when the lease is lost, each of them
// counts (each ran), and the chain's members behind the batch do not.
func TestLostLeaseBatchStarted(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	lease := &postgres.Options{Lease: time.Second, PollInterval: 50 * time.Millisecond}
	crashed := e.sub("t", "s", policy.Ordered, lease)
	sendBatch(t, tp, msg("A", "a1"), msg("A", "a2"), msg("A", "a3"))
	ctx := ctxT(t, 30*time.Second)
	got := receiveN(t, ctx, crashed, 3)
	if err := crashed.Started(ctx, got[:2]); err != nil {
		t.Fatal(err)
	}
	crashed.WaitStarted()
	s := e.sub("t", "s", policy.Ordered, lease)
	if a := attemptsOf(receiveN(t, ctx, s, 3)); !slices.Equal(a, []string{"a1@2", "a2@2", "a3@1"}) {
		t.Fatalf("after the lost lease got %v, want a1@2 a2@2 a3@1", a)
	}
}

// headsState reports whether keyorder's heads are both leased and, when
// the schema records starts (migration 004), whether key's start is
// recorded; on an older schema it reports recorded.
func headsState(t *testing.T, ctx context.Context, e *env, key string) (leased int, recorded bool) {
	t.Helper()
	err := e.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE h.lease_token IS NOT NULL),
		coalesce(bool_or(h.msg_key = $1 AND (NOT to_jsonb(h) ? 'started_end' OR to_jsonb(h)->>'started_end' IS NOT NULL)), false)
		FROM `+e.schema+`.heads h`, key).Scan(&leased, &recorded)
	if err != nil {
		t.Fatal(err)
	}
	return leased, recorded
}

// A consumer process SIGKILLed while a chain head it claimed waits in its
// lanes, never started (its one worker is stuck in another key's handler):
// the lost lease counts an attempt for the message that was running, not
// for the waiting head. The head comes back as attempt 1 and, with
// MaxAttempts 2, fails once and is retried instead of being dead-lettered
// after one run (issue 11).
func TestProcessKilledHoldingUnstartedHead(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	ctx := ctxT(t, 90*time.Second)
	if err := e.admin.CreateSubscription(ctx, "t", "s", &postgres.SubscriptionOptions{Ordering: policy.Ordered,
		MaxAttempts: 2, MinBackoff: 10 * time.Millisecond, MaxBackoff: 10 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	sendBatch(t, tp, msg("A", "a1"))
	sendBatch(t, tp, msg("B", "b1"), msg("B", "b2"))
	h := startHelperKind(t, e, "stack", "t", 2*time.Second, 0, "a1")
	waitUntil(t, 30*time.Second, "the helper to run a1 while it holds B's chain", func() bool {
		rs := h.read(t, 0)
		leased, recorded := headsState(t, ctx, e, "A")
		return len(rs) > 0 && leased == 2 && recorded
	})
	h.kill()
	if rs := h.read(t, 0); len(rs) != 1 || rs[0].id != "a1" {
		t.Fatalf("the killed process handled %+v, want a1 started and nothing else (b1 waiting behind it)", rs)
	}

	drv, err := postgres.OpenSubscriptionDriver(ctx, e.pool, "t", "s",
		e.opts(&postgres.Options{Lease: 2 * time.Second, PollInterval: 50 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	sub, err := subscribe.New(drv, &subscribe.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	runs := map[string][]int{}
	ran := func() map[string][]int {
		mu.Lock()
		defer mu.Unlock()
		out := map[string][]int{}
		for k, v := range runs {
			out[k] = slices.Clone(v)
		}
		return out
	}
	done := make(chan error, 1)
	go func() {
		done <- sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
			mu.Lock()
			runs[d.ID] = append(runs[d.ID], d.Attempt)
			n := len(runs[d.ID])
			mu.Unlock()
			if d.ID == "b1" && n == 1 {
				return errors.New("b1 fails once")
			}
			return nil
		})
	}()
	waitUntil(t, 30*time.Second, "a1 and b2 handled", func() bool {
		r := ran()
		return len(r["a1"]) > 0 && len(r["b2"]) > 0
	})
	if err := sub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	r := ran()
	if !slices.Equal(r["b1"], []int{1, 2}) {
		t.Fatalf("b1 ran with attempts %v, want [1 2]: it never started in the killed process", r["b1"])
	}
	if !slices.Equal(r["a1"], []int{2}) {
		t.Fatalf("a1 ran with attempts %v, want [2]: it was running when its process died", r["a1"])
	}
	dls, err := drv.DeadLetters(ctx, 0)
	if err != nil || len(dls) != 0 {
		t.Fatalf("dead letters %+v %v, want none", dls, err)
	}
}

// A message that kills its consumer in the middle of its handler, every
// time: each run counts an attempt, and with MaxAttempts 2 it is
// dead-lettered unrun by the third consumer (one more run is allowed, should
// a kill beat the asynchronous start record); its key then continues.
func TestProcessKilledPoison(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	ctx := ctxT(t, 120*time.Second)
	if err := e.admin.CreateSubscription(ctx, "t", "s", &postgres.SubscriptionOptions{Ordering: policy.Ordered,
		MaxAttempts: 2, MinBackoff: 10 * time.Millisecond, MaxBackoff: 10 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	sendBatch(t, tp, msg("A", "p1"), msg("A", "a2"))
	var attempts []int
	for {
		if len(attempts) > 3 {
			t.Fatalf("p1 ran %d times (attempts %v) without being dead-lettered", len(attempts), attempts)
		}
		h := startHelperKind(t, e, "stack", "t", time.Second, 0, "p1")
		var next string
		waitUntil(t, 30*time.Second, "p1 or a2 to start", func() bool {
			for _, r := range h.read(t, 0) {
				if r.start {
					next = r.id
					if r.id == "p1" {
						attempts = append(attempts, r.attempt)
					}
					return true
				}
			}
			return false
		})
		if next == "a2" {
			waitUntil(t, 30*time.Second, "a2 to finish", func() bool {
				rs := h.read(t, 0)
				return len(rs) > 1 && !rs[len(rs)-1].start && rs[len(rs)-1].ok
			})
			h.kill()
			break
		}
		h.kill()
	}
	if len(attempts) < 2 || attempts[0] != 1 || attempts[len(attempts)-1] != 2 {
		t.Fatalf("p1 ran with attempts %v, want 1 then 2 (a repeat of 1 at most once)", attempts)
	}
	dls, err := e.sub("t", "s", policy.Ordered, nil).DeadLetters(ctx, 0)
	if err != nil || len(dls) != 1 || dls[0].Message.ID != "p1" || dls[0].Attempts != 3 {
		t.Fatalf("dead letters %+v %v, want p1 after 2 counted runs", dls, err)
	}
}
