package subscribe_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
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

// TestKeyHoldsGoAfterARun: after a run with retries held in process, no
// key's hold is left behind.
func TestKeyHoldsGoAfterARun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := memory.NewBroker()
		if err := b.CreateSubscription("t", "s", &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: memory.InProcess}); err != nil {
			t.Fatal(err)
		}
		drv, err := memhook.Of(b).SubscriptionDriver("s")
		if err != nil {
			t.Fatal(err)
		}
		s, err := subscribe.New(drv, &subscribe.Config{Workers: 2, Retry: policy.Retry{MaxAttempts: 3, MinBackoff: time.Second, MaxBackoff: time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		var handled atomic.Int64
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- s.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
				handled.Add(1)
				if d.Attempt == 1 && d.ID[len(d.ID)-1] == '0' {
					return errors.New("once")
				}
				return nil
			})
		}()
		top := memhook.Of(b).TopicDriver("t")
		var ms []*driver.Message
		for i := range 40 {
			ms = append(ms, &driver.Message{ID: fmt.Sprint("m", i), Key: fmt.Sprint("k", i%4)})
		}
		if err := top.SendBatch(ctx, ms); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if got := handled.Load(); got != 44 {
			t.Errorf("handled %d, want 44 (40 and 4 retries)", got)
		}
		if left := subscribe.KeyHolds(s); left != 0 {
			t.Errorf("%d key holds left after every message was acknowledged", left)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		s.Close(context.Background())
	})
}
