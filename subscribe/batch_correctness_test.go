package subscribe_test

// Regression tests for ordered batches: lane keys, the unrun tail under
// Exclusive, out-of-range failure indexes, and a lost lease of another
// member of the batch.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// publishAccounts publishes messages of one broker key, "tenant", each
// with the account header its id starts with (x1 -> account x).
func publishAccounts(t *testing.T, w *world, ids ...string) {
	t.Helper()
	for _, id := range ids {
		m := &keyorder.Message{ID: id, Key: "tenant", Payload: []byte(id), Headers: map[string]string{"account": id[:1]}}
		if _, err := w.pub.Publish(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
}

// With Config.LaneKey, batches are grouped by the lane key and are handed
// over (at MaxWait in process, after the receive on native hold), one lane
// group each, on both shapes.
func TestBatchLaneKeyDelivers(t *testing.T) {
	for _, hold := range []memory.Hold{memory.InProcess, memory.Native} {
		t.Run(holdName(hold), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: hold, Chain: 4})
				publishAccounts(t, w, "x1", "y1", "x2", "y2")
				var rec batchRec
				s, stop := w.startBatch(t, &subscribe.Config{
					Workers: 2, LaneKey: keyorder.KeyFromHeaders("account"),
					Batch: &subscribe.BatchConfig{MaxSize: 4, MaxWait: time.Second},
				}, func(ctx context.Context, ds []*keyorder.Delivery) error {
					rec.add(ds)
					return nil
				})
				defer stop()
				time.Sleep(time.Minute)
				synctest.Wait()
				got := rec.get()
				slices.SortFunc(got, slices.Compare)
				want := [][]string{{"x1@1", "x2@1"}, {"y1@1", "y2@1"}}
				if !slices.EqualFunc(got, want, slices.Equal) {
					t.Fatalf("batches %v, want %v (in any order)", got, want)
				}
				if st, _ := s.Stats(context.Background()); st.Acked != 4 {
					t.Fatalf("acked %d, want 4", st.Acked)
				}
			})
		})
	}
}

// An open batch of a lane key at shutdown goes back to the broker unrun
// and uncounted: the next consumer gets its messages at attempt 1.
// (In-process hold: on native hold a batch never stays open past its
// receive.)
func TestBatchLaneKeyShutdownReleasesOpenBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: memory.InProcess})
		var rec batchRec
		_, stop := w.startBatch(t, &subscribe.Config{
			LaneKey: keyorder.KeyFromHeaders("account"),
			Batch:   &subscribe.BatchConfig{MaxSize: 4, MaxWait: time.Hour},
		}, func(ctx context.Context, ds []*keyorder.Delivery) error {
			rec.add(ds)
			return nil
		})
		publishAccounts(t, w, "x1")
		synctest.Wait()
		stop()
		if got := rec.get(); len(got) != 0 {
			t.Fatalf("batches %v before MaxWait", got)
		}
		var got startLog
		_, stop2 := w.start(t, nil, nil, func(ctx context.Context, d *keyorder.Delivery) error {
			got.add(fmt.Sprintf("%s@%d", d.ID, d.Attempt))
			return nil
		})
		defer stop2()
		time.Sleep(time.Minute) // past the first consumer's lease
		synctest.Wait()
		if got, want := got.get(), []string{"x1@1"}; !slices.Equal(got, want) {
			t.Fatalf("the next consumer handled %v, want %v", got, want)
		}
	})
}

// Under Exclusive a batch failure at i holds only message i: the members
// after it, which never ran, continue at once, before anything else of the
// key, on both shapes; message i runs after its delay.
func TestBatchExclusiveUnrunTailRunsFirst(t *testing.T) {
	for _, hold := range []memory.Hold{memory.InProcess, memory.Native} {
		t.Run(holdName(hold), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Exclusive, Hold: hold, Chain: 3})
				publishAll(t, w, "A", "a1", "a2", "a3", "a4", "a5", "a6")
				var rec batchRec
				s, stop := w.startBatch(t, &subscribe.Config{Batch: &subscribe.BatchConfig{MaxSize: 3, MaxWait: time.Second}},
					func(ctx context.Context, ds []*keyorder.Delivery) error {
						if rec.add(ds) == 1 {
							return keyorder.FailedAt(1, keyorder.RetryAfter(errors.New("later"), time.Minute))
						}
						return nil
					})
				defer stop()
				time.Sleep(30 * time.Second)
				synctest.Wait()
				want := [][]string{{"a1@1", "a2@1", "a3@1"}, {"a3@1"}, {"a4@1", "a5@1", "a6@1"}}
				if got := rec.get(); !slices.EqualFunc(got, want, slices.Equal) {
					t.Fatalf("batches before a2's delay %v, want %v", got, want)
				}
				time.Sleep(time.Minute)
				synctest.Wait()
				want = append(want, []string{"a2@2"})
				if got := rec.get(); !slices.EqualFunc(got, want, slices.Equal) {
					t.Fatalf("batches %v, want %v", got, want)
				}
				st, _ := s.Stats(context.Background())
				if st.Acked != 6 || st.Retried != 1 {
					t.Fatalf("stats %+v: want 6 acked, 1 retried", st)
				}
			})
		})
	}
}

// The same under Exclusive when the failed message is the batch's first:
// the rest of the batch continues at once.
func TestBatchExclusiveFailAtZero(t *testing.T) {
	for _, hold := range []memory.Hold{memory.InProcess, memory.Native} {
		t.Run(holdName(hold), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Exclusive, Hold: hold, Chain: 3})
				publishAll(t, w, "A", "a1", "a2", "a3", "a4")
				var rec batchRec
				_, stop := w.startBatch(t, &subscribe.Config{
					Batch: &subscribe.BatchConfig{MaxSize: 3, MaxWait: time.Second},
					Retry: policy.Retry{MinBackoff: time.Minute, MaxBackoff: time.Minute},
				}, func(ctx context.Context, ds []*keyorder.Delivery) error {
					if rec.add(ds) == 1 {
						return errors.New("no")
					}
					return nil
				})
				defer stop()
				time.Sleep(2 * time.Minute)
				synctest.Wait()
				want := [][]string{{"a1@1", "a2@1", "a3@1"}, {"a2@1", "a3@1"}, {"a4@1"}, {"a1@2"}}
				if got := rec.get(); !slices.EqualFunc(got, want, slices.Equal) {
					t.Fatalf("batches %v, want %v", got, want)
				}
			})
		})
	}
}

// errObserver records each attempt's outcome and error.
type errObserver struct {
	mu   sync.Mutex
	errs map[string][]error
}

func (o *errObserver) Attach(*subscribe.Subscriber) func() { return nil }

func (o *errObserver) StartProcess(ctx context.Context, d *keyorder.Delivery) (context.Context, func(subscribe.Outcome, error)) {
	return ctx, func(out subscribe.Outcome, err error) {
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.errs == nil {
			o.errs = map[string][]error{}
		}
		o.errs[d.ID] = append(o.errs[d.ID], err)
	}
}

func (o *errObserver) get(id string) []error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.errs[id])
}

// A *keyorder.BatchError whose Index is outside the batch (negative, the
// batch's length, beyond it) fails the batch at index 0 with an error
// that says so and wraps the handler's, on both shapes: never a crash,
// never an acknowledgement the handler did not give.
func TestBatchErrorIndexOutOfRange(t *testing.T) {
	for _, idx := range []int{-1, 2, 7} {
		for _, hold := range []memory.Hold{memory.InProcess, memory.Native} {
			t.Run(fmt.Sprintf("%d/%s", idx, holdName(hold)), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: hold, Chain: 2})
					publishAll(t, w, "A", "a1", "a2")
					var rec batchRec
					cause := errors.New("bad")
					obs := &errObserver{}
					s, stop := w.startBatch(t, &subscribe.Config{
						Observer: obs,
						Batch:    &subscribe.BatchConfig{MaxSize: 2, MaxWait: time.Second},
						Retry:    policy.Retry{MinBackoff: time.Second, MaxBackoff: time.Second},
					}, func(ctx context.Context, ds []*keyorder.Delivery) error {
						if rec.add(ds) == 1 {
							return &keyorder.BatchError{Index: idx, Err: cause}
						}
						return nil
					})
					defer stop()
					time.Sleep(time.Minute)
					synctest.Wait()
					want := [][]string{{"a1@1", "a2@1"}, {"a1@2", "a2@1"}}
					if got := rec.get(); !slices.EqualFunc(got, want, slices.Equal) {
						t.Fatalf("batches %v, want %v", got, want)
					}
					if st, _ := s.Stats(context.Background()); st.Acked != 2 || st.Retried != 1 {
						t.Fatalf("stats %+v: want 2 acked, 1 retried", st)
					}
					errs := obs.get("a1")
					if len(errs) == 0 || !errors.Is(errs[0], subscribe.ErrBatchIndex) || !errors.Is(errs[0], cause) {
						t.Fatalf("a1's first outcome error %v: want ErrBatchIndex wrapping the handler's", errs)
					}
				})
			})
		}
	}
}

// An out-of-range index keeps its error's meaning for message 0: a
// Permanent error dead-letters it, and the key continues.
func TestBatchErrorIndexOutOfRangePermanent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: memory.InProcess})
		publishAll(t, w, "A", "a1", "a2")
		var rec batchRec
		s, stop := w.startBatch(t, &subscribe.Config{Batch: &subscribe.BatchConfig{MaxSize: 2, MaxWait: time.Second}},
			func(ctx context.Context, ds []*keyorder.Delivery) error {
				if rec.add(ds) == 1 {
					return &keyorder.BatchError{Index: -1, Err: keyorder.Permanent(errors.New("bad"))}
				}
				return nil
			})
		defer stop()
		time.Sleep(time.Minute)
		synctest.Wait()
		want := [][]string{{"a1@1", "a2@1"}, {"a2@1"}}
		if got := rec.get(); !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("batches %v, want %v", got, want)
		}
		dl, err := s.DeadLetters(context.Background(), 0)
		if err != nil || len(dl) != 1 || dl[0].Message.ID != "a1" {
			t.Fatalf("dead letters %+v, %v; want a1", dl, err)
		}
	})
}

// A malformed *keyorder.BatchError (a nil one, or one with a nil Err)
// fails the batch with an error, never a crash.
func TestBatchErrorMalformed(t *testing.T) {
	for name, bad := range map[string]error{
		"nil BatchError": (*keyorder.BatchError)(nil),
		"nil Err":        &keyorder.BatchError{Index: 1},
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: memory.InProcess})
				publishAll(t, w, "A", "a1", "a2")
				var rec batchRec
				s, stop := w.startBatch(t, &subscribe.Config{
					Batch: &subscribe.BatchConfig{MaxSize: 2, MaxWait: time.Second},
					Retry: policy.Retry{MinBackoff: time.Second, MaxBackoff: time.Second},
				}, func(ctx context.Context, ds []*keyorder.Delivery) error {
					if rec.add(ds) == 1 {
						return bad
					}
					return nil
				})
				defer stop()
				time.Sleep(time.Minute)
				synctest.Wait()
				if st, _ := s.Stats(context.Background()); st.Acked != 2 || st.Retried != 1 {
					t.Fatalf("stats %+v: want 2 acked, 1 retried (batches %v)", st, rec.get())
				}
			})
		})
	}
}

// losingLease withholds the lease extensions of one message for a while,
// so that its lease (only) is lost.
type losingLease struct {
	driver.Subscription
	mu    sync.Mutex
	id    string
	until time.Time
}

func (s *losingLease) lose(id string, d time.Duration) {
	s.mu.Lock()
	s.id, s.until = id, time.Now().Add(d)
	s.mu.Unlock()
}

func (s *losingLease) ExtendLeases(ctx context.Context, ms []*driver.Message) ([]*driver.Message, error) {
	s.mu.Lock()
	id, stalled := s.id, time.Now().Before(s.until)
	s.mu.Unlock()
	if stalled {
		ms = slices.DeleteFunc(slices.Clone(ms), func(m *driver.Message) bool { return m.ID == id })
	}
	return s.Subscription.ExtendLeases(ctx, ms)
}

// A later member's lost lease cancels the batch's context; the earlier,
// healthy member that the cancelled handler then fails is given back
// without counting an attempt (with MaxAttempts 1 it is not
// dead-lettered) and runs again at attempt 1, on both shapes.
func TestBatchOtherMembersLostLeaseCountsNothing(t *testing.T) {
	for _, hold := range []memory.Hold{memory.InProcess, memory.Native} {
		t.Run(holdName(hold), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: hold, Chain: 2, Lease: 9 * time.Second})
				raw, err := memhook.Of(w.b).SubscriptionDriver("s")
				if err != nil {
					t.Fatal(err)
				}
				drv := &losingLease{Subscription: raw}
				publishAll(t, w, "A", "a1", "a2") // before the first receive, which gets both
				var rec batchRec
				var cancelled error
				cfg := &subscribe.Config{
					Logger: quiet,
					Batch:  &subscribe.BatchConfig{MaxSize: 2, MaxWait: time.Second},
					Retry:  policy.Retry{MaxAttempts: 1},
				}
				s, err := subscribe.New(drv, cfg)
				if err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() {
					done <- s.RunBatch(context.Background(), func(ctx context.Context, ds []*keyorder.Delivery) error {
						if rec.add(ds) == 1 && len(ds) == 2 {
							drv.lose("a2", 15*time.Second)
							<-ctx.Done()
							cancelled = ctx.Err()
							return ctx.Err()
						}
						return nil
					})
				}()
				time.Sleep(time.Minute)
				synctest.Wait()
				if err := s.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				if cancelled == nil {
					t.Fatal("the batch's context was not cancelled when a2's lease was lost")
				}
				dl, err := raw.DeadLetters(context.Background(), 0) // drv hides the store
				if err != nil {
					t.Fatal(err)
				}
				for _, d := range dl {
					if d.Message.ID == "a1" {
						t.Fatalf("a1 dead-lettered (%q) for a2's lost lease", d.Reason)
					}
				}
				got := rec.get()
				if len(got) < 2 || got[1][0] != "a1@1" {
					t.Fatalf("batches %v: want a1 again at attempt 1 after the lost lease", got)
				}
				if st, _ := s.Stats(context.Background()); st.LeasesLost == 0 {
					t.Fatalf("stats %+v: want a lost lease", st)
				}
			})
		})
	}
}
