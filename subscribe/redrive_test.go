package subscribe_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// A DeadLetter call that took effect but returned an error (the broker
// acted; its answer was lost) leaves the subscriber a note to dead-letter
// the message's redelivery. The message is not redelivered: it is a dead
// letter. Redriven, by this Subscriber or by another process through the
// backend's store (as `keyorder dead redrive` does), it is a new copy with
// a fresh attempt count, and it runs: the note is for the copy the failed
// call was made on, not for the message ID.
func TestRedriveRunsAfterDeadLetterErrorThatTookEffect(t *testing.T) {
	for _, hold := range []memory.Hold{memory.Native, memory.InProcess} {
		for _, batch := range []bool{false, true} {
			for _, by := range []string{"subscriber", "another process"} {
				name := fmt.Sprintf("%s/batch=%v/redrive by %s", map[memory.Hold]string{memory.Native: "Native", memory.InProcess: "InProcess"}[hold], batch, by)
				t.Run(name, func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) { redriveAfterLandedDeadLetter(t, hold, batch, by == "subscriber", true) })
				})
			}
		}
		// A driver that names no copies: the note goes by attempts.
		for _, by := range []string{"subscriber", "another process"} {
			name := fmt.Sprintf("%s/no copies/redrive by %s", map[memory.Hold]string{memory.Native: "Native", memory.InProcess: "InProcess"}[hold], by)
			t.Run(name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) { redriveAfterLandedDeadLetter(t, hold, false, by == "subscriber", false) })
			})
		}
	}
}

func redriveAfterLandedDeadLetter(t *testing.T, hold memory.Hold, batch, bySubscriber, copies bool) {
	w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: hold, Lease: 9 * time.Second})
	lost := errors.New("connection reset after the request was sent")
	net := newFlaky(func(op memhook.Op, n int, ms []*driver.Message) memhook.Fault {
		if op == memhook.OpDeadLetter && n == 1 {
			return memhook.Fault{Err: lost, Applied: true} // permanent: given up at once
		}
		return memhook.Fault{}
	})
	if err := memhook.Of(w.b).FailSettlements("s", net.fault); err != nil {
		t.Fatal(err)
	}
	var log startLog
	fail := func(id string, attempt int) error {
		log.add(fmt.Sprintf("%s#%d", id, attempt))
		if id == "c1" && len(log.get()) == 1 {
			return keyorder.Permanent(errors.New("account closed"))
		}
		return nil
	}
	cfg := &subscribe.Config{Workers: 2, Retry: policy.Retry{MaxAttempts: 3}}
	var s *subscribe.Subscriber
	var stop func()
	if batch {
		s, stop = w.startBatch(t, cfg, func(ctx context.Context, ds []*keyorder.Delivery) error {
			for i, d := range ds {
				if err := fail(d.ID, d.Attempt); err != nil {
					return keyorder.FailedAt(i, err)
				}
			}
			return nil
		})
	} else {
		var drv driver.Subscription
		if !copies {
			drv = w.noCopies(t)
		}
		s, stop = w.start(t, drv, cfg, func(ctx context.Context, d *keyorder.Delivery) error { return fail(d.ID, d.Attempt) })
	}
	stop = stopOnce(stop)
	defer stop()
	ctx := context.Background()

	w.publish(t, "c1", "C")
	time.Sleep(30 * time.Second) // c1 dead-lettered; the call's error given up; no redelivery
	synctest.Wait()
	dl, err := s.DeadLetters(ctx, 0)
	if err != nil || len(dl) != 1 || dl[0].Message.ID != "c1" {
		t.Fatalf("dead letters %+v, %v; want c1 (the DeadLetter call took effect)", dl, err)
	}
	var n int
	if bySubscriber {
		n, err = s.Redrive(ctx, []string{"c1"})
	} else {
		other, derr := memhook.Of(w.b).SubscriptionDriver("s") // another process's driver
		if derr != nil {
			t.Fatal(derr)
		}
		n, err = other.Redrive(ctx, []string{"c1"})
	}
	if err != nil || n != 1 {
		t.Fatalf("Redrive = %d, %v", n, err)
	}
	time.Sleep(30 * time.Second)
	synctest.Wait()
	stop()
	if got, want := log.get(), []string{"c1#1", "c1#1"}; !slices.Equal(got, want) {
		t.Errorf("handler ran %v, want %v (the redriven c1 runs, with a fresh attempt count)", got, want)
	}
	if dl, err := s.DeadLetters(ctx, 0); err != nil || len(dl) != 0 {
		t.Errorf("dead letters after the redrive %+v, %v; want none (the redriven c1 was dead-lettered again unrun)", dl, err)
	}
	if n := counts(s).DeadLettered; n != 1 {
		t.Errorf("dead-lettered %d, want 1", n)
	}
}

// A DeadLetter call that did not take effect leaves the message with the
// broker, which redelivers it when its lease expires: that redelivery is
// dead-lettered again without running, also through a driver that names no
// copies (the redelivery's attempt is higher than the failed call's).
func TestRedeliveryAfterFailedDeadLetterWithoutCopies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Lease: 9 * time.Second})
		net := newFlaky(func(op memhook.Op, n int, ms []*driver.Message) memhook.Fault {
			if op == memhook.OpDeadLetter && n == 1 {
				return memhook.Fault{Err: errors.New("access denied")}
			}
			return memhook.Fault{}
		})
		if err := memhook.Of(w.b).FailSettlements("s", net.fault); err != nil {
			t.Fatal(err)
		}
		var log startLog
		s, stop := w.start(t, w.noCopies(t), nil, func(ctx context.Context, d *keyorder.Delivery) error {
			log.add(fmt.Sprintf("%s#%d", d.ID, d.Attempt))
			return keyorder.Permanent(errors.New("account closed"))
		})
		stop = stopOnce(stop)
		defer stop()
		w.publish(t, "c1", "C")
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		if got, want := log.get(), []string{"c1#1"}; !slices.Equal(got, want) {
			t.Errorf("handler ran %v, want %v (the redelivery is dead-lettered unrun)", got, want)
		}
		dl, err := s.DeadLetters(context.Background(), 0)
		if err != nil || len(dl) != 1 || dl[0].Message.ID != "c1" || dl[0].Attempts != 1 {
			t.Errorf("dead letters %+v, %v; want c1 after 1 attempt", dl, err)
		}
	})
}

// noCopies opens a consumer whose deliveries name no copy
// (driver.Message.Copy nil), as a driver of a broker without one.
func (w *world) noCopies(t *testing.T) driver.Subscription {
	t.Helper()
	d, err := memhook.Of(w.b).SubscriptionDriver("s")
	if err != nil {
		t.Fatal(err)
	}
	return copyless{d}
}

type copyless struct{ memhook.Subscription }

func (c copyless) Receive(ctx context.Context, max int) ([]*driver.Message, error) {
	ms, err := c.Subscription.Receive(ctx, max)
	for _, m := range ms {
		m.Copy = nil
	}
	return ms, err
}
