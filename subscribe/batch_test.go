package subscribe_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/lanes"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// batchRec records the batches a batch handler got, as "id@attempt".
type batchRec struct {
	mu sync.Mutex
	b  [][]string
}

func (r *batchRec) add(ds []*keyorder.Delivery) int {
	var names []string
	for _, d := range ds {
		names = append(names, fmt.Sprintf("%s@%d", d.ID, d.Attempt))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.b = append(r.b, names)
	return len(r.b)
}

func (r *batchRec) get() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.b)
}

// startBatch runs RunBatch on the world's subscription; stop closes it.
func (w *world) startBatch(t *testing.T, cfg *subscribe.Config, h subscribe.BatchHandlerFunc) (*subscribe.Subscriber, func()) {
	t.Helper()
	drv, err := memhook.Of(w.b).SubscriptionDriver("s")
	if err != nil {
		t.Fatal(err)
	}
	if cfg == nil {
		cfg = &subscribe.Config{}
	}
	cfg.Logger = quiet
	s, err := subscribe.New(drv, cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.RunBatch(context.Background(), h) }()
	return s, stopOnce(func() {
		t.Helper()
		if err := s.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("RunBatch: %v", err)
		}
	})
}

func publishAll(t *testing.T, w *world, key string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		w.publish(t, id, key)
	}
}

// A failure at index 2 with RetryAfter: the first two are acknowledged, the
// third is retried after the delay with the two behind it, whose attempts
// are not counted; on both shapes of broker.
func TestBatchFailedAtRetryAfter(t *testing.T) {
	for _, hold := range []memory.Hold{memory.InProcess, memory.Native} {
		t.Run(holdName(hold), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: hold, Chain: 5})
				publishAll(t, w, "A", "a1", "a2", "a3", "a4", "a5")
				var rec batchRec
				s, stop := w.startBatch(t, &subscribe.Config{Workers: 2, Batch: &subscribe.BatchConfig{MaxSize: 5, MaxWait: time.Second}},
					func(ctx context.Context, ds []*keyorder.Delivery) error {
						if rec.add(ds) == 1 {
							return keyorder.FailedAt(2, keyorder.RetryAfter(errors.New("later"), time.Minute))
						}
						return nil
					})
				defer stop()
				synctest.Wait()
				if got := rec.get(); len(got) != 1 {
					t.Fatalf("batches before the retry delay: %v", got)
				}
				time.Sleep(2 * time.Minute)
				synctest.Wait()
				want := [][]string{{"a1@1", "a2@1", "a3@1", "a4@1", "a5@1"}, {"a3@2", "a4@1", "a5@1"}}
				if got := rec.get(); !slices.EqualFunc(got, want, slices.Equal) {
					t.Fatalf("batches %v, want %v", got, want)
				}
				st, _ := s.Stats(context.Background())
				if st.Acked != 5 || st.Retried != 1 || st.Handled != 8 {
					t.Fatalf("stats %+v: want 5 acked, 1 retried, 8 handled", st)
				}
			})
		})
	}
}

// A panic fails the batch at index 0.
func TestBatchPanicFailsAtZero(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: memory.InProcess})
		publishAll(t, w, "A", "a1", "a2")
		var rec batchRec
		s, stop := w.startBatch(t, &subscribe.Config{Batch: &subscribe.BatchConfig{MaxSize: 2}, Retry: policy.Retry{MinBackoff: time.Second, MaxBackoff: time.Second}},
			func(ctx context.Context, ds []*keyorder.Delivery) error {
				if rec.add(ds) == 1 {
					panic("boom")
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
		if st, _ := s.Stats(context.Background()); st.Panics != 1 {
			t.Fatalf("Panics = %d, want 1", st.Panics)
		}
	})
}

// A dead letter inside a batch: the key continues with the next message at
// once, in a batch of what is left.
func TestBatchDeadLetterContinues(t *testing.T) {
	for _, hold := range []memory.Hold{memory.InProcess, memory.Native} {
		t.Run(holdName(hold), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: hold, Chain: 5})
				publishAll(t, w, "A", "a1", "a2", "a3", "a4")
				var rec batchRec
				s, stop := w.startBatch(t, &subscribe.Config{Batch: &subscribe.BatchConfig{MaxSize: 4}},
					func(ctx context.Context, ds []*keyorder.Delivery) error {
						if rec.add(ds) == 1 {
							return keyorder.FailedAt(1, keyorder.Permanent(errors.New("bad")))
						}
						return nil
					})
				defer stop()
				time.Sleep(time.Second)
				synctest.Wait()
				want := [][]string{{"a1@1", "a2@1", "a3@1", "a4@1"}, {"a3@1", "a4@1"}}
				if got := rec.get(); !slices.EqualFunc(got, want, slices.Equal) {
					t.Fatalf("batches %v, want %v", got, want)
				}
				dl, err := s.DeadLetters(context.Background(), 0)
				if err != nil || len(dl) != 1 || dl[0].Message.ID != "a2" || dl[0].Attempts != 1 {
					t.Fatalf("dead letters %+v, %v; want a2 with 1 attempt", dl, err)
				}
			})
		})
	}
}

// Keyless messages come in batches of one; a batch never mixes keys.
func TestBatchKeylessAndKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: memory.InProcess})
		p, err := publish.New(memhook.Of(w.b).TopicDriver("t"), &publish.Config{Logger: quiet, MissingKey: policy.Unordered})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close(context.Background())
		for _, spec := range []string{"a1:A", "s1:", "b1:B", "a2:A", "s2:", "b2:B"} {
			id, key, _ := strings.Cut(spec, ":")
			if _, err := p.Publish(context.Background(), &keyorder.Message{ID: id, Key: key, Payload: []byte(id)}); err != nil {
				t.Fatal(err)
			}
		}
		var rec batchRec
		_, stop := w.startBatch(t, nil, func(ctx context.Context, ds []*keyorder.Delivery) error {
			rec.add(ds)
			return nil
		})
		defer stop()
		time.Sleep(time.Second)
		synctest.Wait()
		got := rec.get()
		var sizes []string
		for _, b := range got {
			sizes = append(sizes, strings.Join(b, " "))
		}
		slices.Sort(sizes)
		want := []string{"a1@1 a2@1", "b1@1 b2@1", "s1@1", "s2@1"}
		if !slices.Equal(sizes, want) {
			t.Fatalf("batches %v, want %v (in any order)", got, want)
		}
	})
}

// The observer sees each message of a batch: acknowledged before the
// failed index, retried at it, released after it.
func TestBatchObserverPerMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: memory.InProcess})
		publishAll(t, w, "A", "a1", "a2", "a3")
		obs := &outcomeObserver{}
		var calls int
		_, stop := w.startBatch(t, &subscribe.Config{Observer: obs, Batch: &subscribe.BatchConfig{MaxSize: 3}},
			func(ctx context.Context, ds []*keyorder.Delivery) error {
				calls++
				if calls == 1 {
					return keyorder.FailedAt(1, errors.New("no"))
				}
				return nil
			})
		defer stop()
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		want := []string{"a1:ack", "a2:retry", "a3:released", "a2:ack", "a3:ack"}
		if got := obs.get(); !slices.Equal(got, want) {
			t.Fatalf("outcomes %v, want %v", got, want)
		}
	})
}

type outcomeObserver struct {
	mu  sync.Mutex
	out []string
}

func (o *outcomeObserver) Attach(*subscribe.Subscriber) func() { return nil }

func (o *outcomeObserver) StartProcess(ctx context.Context, d *keyorder.Delivery) (context.Context, func(subscribe.Outcome, error)) {
	return ctx, func(out subscribe.Outcome, _ error) {
		o.mu.Lock()
		o.out = append(o.out, d.ID+":"+out.String())
		o.mu.Unlock()
	}
}

func (o *outcomeObserver) get() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.out)
}

func TestBatchConfigValidate(t *testing.T) {
	w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered})
	for _, bc := range []*subscribe.BatchConfig{{MaxSize: -1}, {MaxSize: subscribe.BatchMaxSizeLimit + 1}, {MaxWait: -time.Second}} {
		drv, err := memhook.Of(w.b).SubscriptionDriver("s")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := subscribe.New(drv, &subscribe.Config{Batch: bc}); !errors.Is(err, keyorder.ErrInvalidConfig) {
			t.Errorf("BatchConfig %+v: err %v, want ErrInvalidConfig", bc, err)
		}
		drv.Close()
	}
	if got := (*subscribe.BatchConfig)(nil).WithDefaults(); got.MaxSize != subscribe.BatchMaxSizeDefault || got.MaxWait != subscribe.BatchMaxWaitDefault {
		t.Errorf("defaults %+v", got)
	}
}

// MaxWait: a batch that does not fill is handed over when MaxWait has
// passed since its first message arrived, not before and not never.
func TestBatchMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: memory.InProcess})
		var rec batchRec
		var at time.Time
		_, stop := w.startBatch(t, &subscribe.Config{Batch: &subscribe.BatchConfig{MaxSize: 10, MaxWait: 3 * time.Second}},
			func(ctx context.Context, ds []*keyorder.Delivery) error {
				rec.add(ds)
				at = time.Now()
				return nil
			})
		defer stop()
		synctest.Wait()
		start := time.Now()
		w.publish(t, "a1", "A")
		time.Sleep(time.Second)
		w.publish(t, "a2", "A")
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got, want := rec.get(), [][]string{{"a1@1", "a2@1"}}; !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("batches %v, want %v", got, want)
		}
		if d := at.Sub(start); d != 3*time.Second {
			t.Fatalf("batch handed over after %v, want MaxWait 3s", d)
		}
	})
}

func holdName(h memory.Hold) string {
	if h == memory.Native {
		return "Native"
	}
	return "InProcess"
}

// Under Exclusive and Parallel a failure inside a batch still ends with
// every message handled, on both shapes; under Exclusive at most one batch
// of a key runs at a time.
func TestBatchExclusiveAndParallel(t *testing.T) {
	for _, ord := range []policy.Ordering{policy.Exclusive, policy.Parallel} {
		for _, hold := range []memory.Hold{memory.InProcess, memory.Native} {
			t.Run(ord.String()+"/"+holdName(hold), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					w := newWorld(t, &memory.SubscriptionOptions{Ordering: ord, Hold: hold, Chain: 4})
					var ids []string
					for i := range 20 {
						ids = append(ids, fmt.Sprintf("a%02d", i))
					}
					publishAll(t, w, "A", ids...)
					var mu sync.Mutex
					done := map[string]bool{}
					inFlight, maxInFlight, calls := 0, 0, 0
					cfg := &subscribe.Config{Workers: 4, Batch: &subscribe.BatchConfig{MaxSize: 5}}
					if ord == policy.Parallel {
						cfg.Assign = lanes.Shared // ByKey would keep the key on one lane
					}
					s, stop := w.startBatch(t, cfg,
						func(ctx context.Context, ds []*keyorder.Delivery) error {
							mu.Lock()
							calls++
							first := calls == 1
							inFlight++
							maxInFlight = max(maxInFlight, inFlight)
							mu.Unlock()
							time.Sleep(time.Second)
							mu.Lock()
							defer mu.Unlock()
							inFlight--
							if first && len(ds) > 1 {
								done[ds[0].ID] = true
								return keyorder.FailedAt(1, errors.New("no"))
							}
							for _, d := range ds {
								done[d.ID] = true
							}
							return nil
						})
					defer stop()
					time.Sleep(5 * time.Minute)
					synctest.Wait()
					mu.Lock()
					defer mu.Unlock()
					if len(done) != 20 {
						t.Fatalf("handled %d of 20", len(done))
					}
					t.Logf("at most %d batches of key A in flight", maxInFlight)
					if ord == policy.Exclusive && maxInFlight > 1 {
						t.Fatalf("%d batches of one key in flight under Exclusive", maxInFlight)
					}
					if ord == policy.Parallel && hold == memory.InProcess && maxInFlight < 2 {
						t.Fatalf("one batch of the key at a time under Parallel on shared lanes")
					}
					if st, _ := s.Stats(context.Background()); st.Acked != 20 {
						t.Fatalf("acked %d, want 20", st.Acked)
					}
				})
			})
		}
	}
}

// Throttles under RunBatch: a batch draws a token per message (up to the
// bucket's Burst) from the buckets of its first message, and a batch that
// waits for tokens waits whole, counting no attempt, on both shapes.
func TestBatchThrottled(t *testing.T) {
	for _, hold := range []memory.Hold{memory.InProcess, memory.Native} {
		t.Run(holdName(hold), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: hold, Chain: 3})
				publishAll(t, w, "A", "a1", "a2", "a3", "a4", "a5", "a6")
				var rec batchRec
				var at []time.Duration
				start := time.Now()
				s, stop := w.startBatch(t, &subscribe.Config{
					Batch:     &subscribe.BatchConfig{MaxSize: 3, MaxWait: time.Millisecond},
					Throttles: []subscribe.Throttle{{By: subscribe.OrderingKey, Rate: 1, Burst: 3}},
				}, func(ctx context.Context, ds []*keyorder.Delivery) error {
					rec.add(ds)
					at = append(at, time.Since(start).Round(time.Second))
					return nil
				})
				defer stop()
				time.Sleep(time.Minute)
				synctest.Wait()
				want := [][]string{{"a1@1", "a2@1", "a3@1"}, {"a4@1", "a5@1", "a6@1"}}
				if got := rec.get(); !slices.EqualFunc(got, want, slices.Equal) {
					t.Fatalf("batches %v, want %v", got, want)
				}
				// The first batch empties the bucket of 3; the second
				// waits 3 s for 3 tokens at 1 a second.
				if len(at) != 2 || at[0] != 0 || at[1] != 3*time.Second {
					t.Fatalf("batches ran at %v, want [0s 3s]", at)
				}
				st, _ := s.Stats(context.Background())
				if st.Throttled == 0 || st.Retried != 0 || st.Acked != 6 {
					t.Fatalf("stats %+v: want throttled > 0, no retries, 6 acked", st)
				}
			})
		})
	}
}
