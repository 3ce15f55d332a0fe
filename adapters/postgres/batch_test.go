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

// pgBatches records the batches a batch handler got, as "id@attempt".
type pgBatches struct {
	mu sync.Mutex
	b  [][]string
}

func (r *pgBatches) add(ds []*keyorder.Delivery) int {
	var names []string
	for _, d := range ds {
		names = append(names, fmt.Sprintf("%s@%d", d.ID, d.Attempt))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.b = append(r.b, names)
	return len(r.b)
}

func (r *pgBatches) get() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.b)
}

// runBatchUntil runs RunBatch on drv until want messages are acknowledged
// (or 30 s pass, which fails the test), then stops it.
func runBatchUntil(t *testing.T, drv driver.Subscription, cfg *subscribe.Config, want int64, h subscribe.BatchHandlerFunc) {
	t.Helper()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	sub, err := subscribe.New(drv, cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sub.RunBatch(context.Background(), h) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, _ := sub.Stats(context.Background())
		if st.Acked >= want {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("acked %d of %d after 30s", st.Acked, want)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := sub.Close(context.Background()); err != nil {
		t.Error(err)
	}
	if err := <-done; err != nil {
		t.Error(err)
	}
}

// RunBatch with Config.LaneKey hands over batches of each lane group of a
// claimed chain.
func TestRunBatchLaneKey(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	drv := e.sub("t", "s", policy.Ordered, &postgres.Options{ChainLength: 4})
	var ms []*driver.Message
	for _, id := range []string{"x1", "y1", "x2", "y2"} {
		m := msg("tenant", id)
		m.Headers = map[string]string{"account": id[:1]}
		ms = append(ms, m)
	}
	sendBatch(t, tp, ms...)
	var rec pgBatches
	runBatchUntil(t, drv, &subscribe.Config{
		LaneKey: keyorder.KeyFromHeaders("account"),
		Batch:   &subscribe.BatchConfig{MaxSize: 4},
	}, 4, func(ctx context.Context, ds []*keyorder.Delivery) error {
		rec.add(ds)
		return nil
	})
	got := rec.get()
	slices.SortFunc(got, slices.Compare)
	if want := [][]string{{"x1@1", "x2@1"}, {"y1@1", "y2@1"}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("batches %v, want %v (in any order)", got, want)
	}
}

// Under Exclusive a batch failure at 1 holds only that message: the
// member after it, which never ran, runs next, before the rest of the key.
func TestRunBatchExclusiveUnrunTailFirst(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	drv := e.sub("t", "s", policy.Exclusive, &postgres.Options{ChainLength: 3})
	var ms []*driver.Message
	for i := 1; i <= 6; i++ {
		ms = append(ms, msg("A", fmt.Sprintf("a%d", i)))
	}
	sendBatch(t, tp, ms...)
	var rec pgBatches
	runBatchUntil(t, drv, &subscribe.Config{Batch: &subscribe.BatchConfig{MaxSize: 3}}, 6,
		func(ctx context.Context, ds []*keyorder.Delivery) error {
			if rec.add(ds) == 1 {
				return keyorder.FailedAt(1, keyorder.RetryAfter(errors.New("later"), 2*time.Second))
			}
			return nil
		})
	got := rec.get()
	if len(got) < 2 || !slices.Equal(got[0], []string{"a1@1", "a2@1", "a3@1"}) || !slices.Equal(got[1], []string{"a3@1"}) {
		t.Fatalf("batches %v: want [a1 a2 a3] failing at a2, then a3 alone before anything else", got)
	}
	if last := got[len(got)-1]; !slices.Equal(last, []string{"a2@2"}) {
		t.Fatalf("batches %v: want a2's retry last", got)
	}
}
