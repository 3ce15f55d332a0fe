package postgres_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/policy"
)

// TestCrashKeepsRetryDelay (the guarantee table's PostgreSQL crash row):
// a message that failed with a retry delay keeps it when its process dies
// while it waits. The failure is a Nack that writes the retry time into
// the message's row before the process can die, so nothing of it is held
// in process. Here a1 fails with a 3 s delay while a2 waits behind it in
// the same chain, and the process dies (it stops, its lease on a2 runs
// out, as after a SIGKILL); the next consumer gets nothing of the key
// before a1's retry time, then a1 as attempt 2, then a2.
func TestCrashKeepsRetryDelay(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	lease := &postgres.Options{LeaseDuration: time.Second, PollInterval: 50 * time.Millisecond}
	crashed := e.sub("t", "s", policy.Ordered, lease)
	sendBatch(t, tp, msg("A", "a1"), msg("A", "a2"))
	ctx := ctxT(t, 30*time.Second)
	got := receiveN(t, ctx, crashed, 2)
	if !slices.Equal(ids(got), []string{"a1", "a2"}) {
		t.Fatalf("received %v, want [a1 a2]", ids(got))
	}
	if err := crashed.Started(ctx, got[:1]); err != nil {
		t.Fatal(err)
	}
	const delay = 3 * time.Second
	failed := time.Now()
	if err := crashed.Nack(ctx, got[0], delay); err != nil {
		t.Fatal(err)
	}
	crashed.WaitStarted()
	// The process dies here: a2 stays leased to it until its lease runs
	// out, and nobody settles anything more.

	s := e.sub("t", "s", policy.Ordered, lease)
	receiveNone(t, s, delay-time.Since(failed)-200*time.Millisecond)
	again := receiveN(t, ctx, s, 1)
	if early := delay - time.Since(failed); early > 0 {
		t.Fatalf("%s redelivered %v before a1's retry time", again[0].ID, early)
	}
	if err := s.Ack(ctx, again); err != nil {
		t.Fatal(err)
	}
	again = append(again, receiveN(t, ctx, s, 1)...)
	var attempts []string
	for _, m := range again {
		attempts = append(attempts, fmt.Sprintf("%s@%d", m.ID, m.Attempt))
	}
	if !slices.Equal(attempts, []string{"a1@2", "a2@1"}) {
		t.Fatalf("after the crash got %v, want [a1@2 a2@1]: a1 at its retry time, counted once, then a2", attempts)
	}
}
