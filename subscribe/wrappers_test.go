package subscribe_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// A handler that returns keyorder.Permanent(err) or RetryAfter(err, d)
// with a nil err succeeded: the message is acknowledged, not dead-lettered
// or retried.
func TestWrappedNilErrorAcks(t *testing.T) {
	for name, wrap := range map[string]func(error) error{
		"Permanent":  keyorder.Permanent,
		"RetryAfter": func(err error) error { return keyorder.RetryAfter(err, time.Hour) },
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered})
				w.publish(t, "m1", "k")
				w.publish(t, "m2", "k")
				var mu sync.Mutex
				var got []string
				s, stop := w.start(t, nil, nil, func(ctx context.Context, d *keyorder.Delivery) error {
					mu.Lock()
					got = append(got, d.ID)
					mu.Unlock()
					var err error // the call succeeded
					return wrap(err)
				})
				time.Sleep(2 * time.Hour)
				synctest.Wait()
				stop()
				st, _ := s.Stats(context.Background())
				dl, _ := s.DeadLetters(context.Background(), 10)
				mu.Lock()
				defer mu.Unlock()
				if len(got) != 2 || st.Acked != 2 || st.DeadLettered != 0 || st.Retried != 0 || len(dl) != 0 {
					t.Fatalf("handled %v, stats %+v, dead letters %v; want m1 and m2 acknowledged once each", got, st, dl)
				}
			})
		})
	}
}

// A batch handler that returns keyorder.FailedAt(i, err) with a nil err
// succeeded: the whole batch is acknowledged.
func TestBatchFailedAtNilAcks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: memory.InProcess})
		w.publish(t, "m1", "k")
		w.publish(t, "m2", "k")
		var rec batchRec
		s, stop := w.startBatch(t, &subscribe.Config{Batch: &subscribe.BatchConfig{MaxSize: 2, MaxWait: time.Second}},
			func(ctx context.Context, ds []*keyorder.Delivery) error {
				rec.add(ds)
				var err error
				return keyorder.FailedAt(1, err)
			})
		time.Sleep(time.Hour)
		synctest.Wait()
		stop()
		st, _ := s.Stats(context.Background())
		if n := len(rec.get()); st.Acked != 2 || st.DeadLettered != 0 || st.Retried != 0 || n == 0 {
			t.Fatalf("batches %v, stats %+v; want both acknowledged", rec.get(), st)
		}
	})
}

// RetryAfter with a delay already past (a negative time.Until) retries at
// once, without panicking and without falling back to the backoff.
func TestRetryAfterNegativeDelayRetriesNow(t *testing.T) {
	for _, hold := range []memory.Hold{memory.Native, memory.InProcess} {
		synctest.Test(t, func(t *testing.T) {
			w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: hold})
			w.publish(t, "m1", "k")
			var mu sync.Mutex
			var at []time.Duration
			start := time.Now()
			s, stop := w.start(t, nil, &subscribe.Config{Retry: policy.Retry{MinBackoff: time.Hour, MaxBackoff: time.Hour}},
				func(ctx context.Context, d *keyorder.Delivery) error {
					mu.Lock()
					defer mu.Unlock()
					at = append(at, time.Since(start))
					if len(at) == 1 {
						return keyorder.RetryAfter(errors.New("busy"), time.Until(start.Add(-time.Minute)))
					}
					return nil
				})
			time.Sleep(time.Minute)
			synctest.Wait()
			stop()
			st, _ := s.Stats(context.Background())
			mu.Lock()
			defer mu.Unlock()
			if len(at) != 2 || at[1] != at[0] || st.Acked != 1 || st.Retried != 1 {
				t.Fatalf("hold %d: attempts at %v, stats %+v; want a retry at once, then acknowledged", hold, at, st)
			}
		})
	}
}
