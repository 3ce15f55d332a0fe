package postgres_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// TestReturnKeepsAttemptsAndDelay (issue 28, item 2): a message that ran
// and waits for a retry, given back at a graceful stop with Return, comes
// back with its count (attempt Attempts+1) and not before its NotBefore;
// under Ordered its key's later message waits behind it. Both a keyed
// delivery (Ordered) and a direct one (Parallel, counted at claim).
func TestReturnKeepsAttemptsAndDelay(t *testing.T) {
	for _, ordering := range []policy.Ordering{policy.Ordered, policy.Parallel} {
		t.Run(ordering.String(), func(t *testing.T) {
			e := newEnv(t)
			tp := e.topic("t", nil)
			s := e.sub("t", "s", ordering, nil)
			sendBatch(t, tp, msg("A", "a1"), msg("A", "a2"))
			ctx := ctxT(t, 30*time.Second)
			got := receiveN(t, ctx, s, 2)
			if err := s.Started(ctx, got[:1]); err != nil {
				t.Fatal(err)
			}
			r, ok := any(s).(driver.Returner)
			if !ok {
				t.Fatal("the PostgreSQL subscription driver does not implement driver.Returner")
			}
			due := time.Now().Add(2 * time.Second)
			if err := r.Return(ctx, []driver.Returned{{Message: got[0], Attempts: 3, NotBefore: due}}); err != nil {
				t.Fatal(err)
			}
			if ordering == policy.Ordered {
				if err := s.Release(ctx, got[1:]); err != nil {
					t.Fatal(err)
				}
				receiveNone(t, s, time.Second) // a1 is held for its delay, a2 behind it
			} else {
				if err := s.Ack(ctx, got[1:]); err != nil {
					t.Fatal(err)
				}
			}
			var again []string
			for len(again) < 1 || ordering == policy.Ordered && len(again) < 2 {
				ms := receiveN(t, ctx, s, 1)
				if time.Now().Before(due) {
					t.Fatalf("%s delivered %v before its NotBefore", ms[0].ID, time.Until(due))
				}
				for _, m := range ms {
					again = append(again, fmt.Sprintf("%s@%d", m.ID, m.Attempt))
				}
				if err := s.Ack(ctx, ms); err != nil {
					t.Fatal(err)
				}
			}
			want := []string{"a1@4"}
			if ordering == policy.Ordered {
				want = append(want, "a2@1")
			}
			if !slices.Equal(again, want) {
				t.Fatalf("after Return got %v, want %v: the count carried across the stop", again, want)
			}
		})
	}
}
