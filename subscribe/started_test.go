package subscribe_test

import (
	"context"
	"errors"
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

// startRecorder is a driver that records starts (driver.StartRecorder) over
// the memory driver: the log interleaves "started" calls with handler runs.
type startRecorder struct {
	driver.Subscription
	mu  sync.Mutex
	log [][]string
}

func (d *startRecorder) Started(ctx context.Context, ms []*driver.Message) error {
	e := []string{"started"}
	for _, m := range ms {
		e = append(e, m.ID)
	}
	d.add(e)
	return nil
}

func (d *startRecorder) add(e []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.log = append(d.log, e)
}

func (d *startRecorder) get() [][]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.log)
}

// The subscriber tells a driver that records starts that a handler starts,
// right before each run (a retry too), and never for a message that does
// not run; under RunBatch once per batch, with the members that run.
func TestStartedBeforeEachRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Chain: 3,
			Retry: &policy.Retry{MaxAttempts: 5, MinBackoff: time.Second, MaxBackoff: time.Second}})
		publishAll(t, w, "A", "a1", "a2")
		inner, err := memhook.Of(w.b).SubscriptionDriver("s")
		if err != nil {
			t.Fatal(err)
		}
		drv := &startRecorder{Subscription: inner}
		failed := false
		_, stop := w.start(t, drv, &subscribe.Config{Workers: 1}, func(ctx context.Context, d *keyorder.Delivery) error {
			drv.add([]string{"run", d.ID})
			if d.ID == "a1" && !failed {
				failed = true
				return errors.New("once")
			}
			return nil
		})
		synctest.Wait()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		stop()
		want := [][]string{
			{"started", "a1"}, {"run", "a1"}, // fails: a2 goes back unrun, unstarted
			{"started", "a1"}, {"run", "a1"},
			{"started", "a2"}, {"run", "a2"},
		}
		if got := drv.get(); !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("log %v, want %v", got, want)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Chain: 3})
		publishAll(t, w, "A", "a1", "a2", "a3")
		inner, err := memhook.Of(w.b).SubscriptionDriver("s")
		if err != nil {
			t.Fatal(err)
		}
		drv := &startRecorder{Subscription: inner}
		cfg := &subscribe.Config{Logger: quiet, Batch: &subscribe.BatchConfig{MaxSize: 3}}
		s, err := subscribe.New(drv, cfg)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			done <- s.RunBatch(context.Background(), func(ctx context.Context, ds []*keyorder.Delivery) error {
				e := []string{"run"}
				for _, d := range ds {
					e = append(e, d.ID)
				}
				drv.add(e)
				return nil
			})
		}()
		synctest.Wait()
		if err := s.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		want := [][]string{{"started", "a1", "a2", "a3"}, {"run", "a1", "a2", "a3"}}
		if got := drv.get(); !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("log %v, want %v", got, want)
		}
	})
}
