package subscribe_test

// Tests of what a broker may do that the memory broker does not do by
// itself (lost leases per delivery, HoldChains, graceful stops carrying
// attempts), and of Close's bounds.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
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

// holdChains declares Capabilities.HoldChains over a memory driver, as the
// SQS driver does under Ordered: a failed chain member is retried in
// process while the rest of its chain stays leased.
type holdChains struct{ driver.Subscription }

func (h holdChains) Capabilities() driver.Capabilities {
	c := h.Subscription.Capabilities()
	c.HoldChains = true
	return c
}

// TestHoldChainsRetryGetsItsOwnPayload: under HoldChains a chain member
// retried in process is handed its own copy of the payload, as a retry held
// in process is on any other broker: what a handler writes into attempt 1's
// payload (decoding in place) never reaches attempt 2. Before the fix the
// retry got the same bytes and saw "SCRIBBLE".
func TestHoldChainsRetryGetsItsOwnPayload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Chain: 2})
		if _, err := w.pub.Publish(context.Background(), &keyorder.Message{ID: "k1", Key: "k", Payload: []byte("original")}); err != nil {
			t.Fatal(err)
		}
		w.publish(t, "k2", "k")
		raw, err := memhook.Of(w.b).SubscriptionDriver("s")
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var seen []string
		_, stop := w.start(t, holdChains{raw}, &subscribe.Config{Workers: 1, MaxOutstanding: 2}, func(ctx context.Context, d *keyorder.Delivery) error {
			if d.ID != "k1" {
				return nil
			}
			mu.Lock()
			seen = append(seen, string(d.Payload))
			mu.Unlock()
			if d.Attempt == 1 {
				copy(d.Payload, "SCRIBBLE")
				return errors.New("fail once")
			}
			return nil
		})
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(seen, []string{"original", "original"}) {
			t.Fatalf("k1's attempts saw payloads %q; want [original original]", seen)
		}
	})
}

// TestBatchPermanentWithOtherMembersLostLease: a batch handler that fails
// its first member with Permanent while a later member's lease is lost has
// decided that member's fate: it is dead-lettered, as under Run, not run
// again in process uncounted. Before the fix the batches were [b1 b2] [b1]
// [b2] and b1 was never dead-lettered.
func TestBatchPermanentWithOtherMembersLostLease(t *testing.T) {
	for _, hold := range []memory.Hold{memory.InProcess, memory.Native} {
		t.Run(holdName(hold), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: hold, Chain: 2, LeaseDuration: 9 * time.Second})
				raw, err := memhook.Of(w.b).SubscriptionDriver("s")
				if err != nil {
					t.Fatal(err)
				}
				drv := &losingLease{Subscription: raw}
				publishAll(t, w, "B", "b1", "b2") // before the first receive, which gets both
				var rec batchRec
				s, err := subscribe.New(drv, &subscribe.Config{
					Logger: quiet,
					Batch:  &subscribe.BatchConfig{MaxSize: 2, MaxWait: time.Second},
				})
				if err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() {
					done <- s.RunBatch(context.Background(), func(ctx context.Context, ds []*keyorder.Delivery) error {
						if rec.add(ds) == 1 && len(ds) == 2 {
							drv.lose("b2", 15*time.Second)
							<-ctx.Done()
							return keyorder.FailedAt(0, keyorder.Permanent(errors.New("b1 is poison")))
						}
						for i, d := range ds {
							if d.ID == "b1" {
								return keyorder.FailedAt(i, keyorder.Permanent(errors.New("b1 is poison")))
							}
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
				got := rec.get()
				for _, b := range got[1:] {
					for _, n := range b {
						if n[:2] == "b1" {
							t.Fatalf("batches %v: b1 ran again after the handler failed it with Permanent", got)
						}
					}
				}
				dl, err := raw.DeadLetters(context.Background(), 0)
				if err != nil {
					t.Fatal(err)
				}
				if len(dl) != 1 || dl[0].Message.ID != "b1" || dl[0].Attempts != 1 {
					t.Fatalf("dead letters %+v; want b1 alone, after 1 attempt", dl)
				}
				if len(got) < 2 || got[len(got)-1][0][:2] != "b2" {
					t.Fatalf("batches %v: want b2 to run after b1 was dead-lettered", got)
				}
			})
		})
	}
}

// logBuf is a slog handler's destination that tests read.
type logBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestCloseEndsWhenItsContextEnds: a handler that ignores its context does
// not keep Close or Run past Close's context: Close returns the context's
// error, Run returns, and the handler still running is logged with its key,
// ID and how long it ran. Before the fix Close was still blocked 12 s
// after its 1 s context ended, Run had not returned, and nothing was logged.
func TestCloseEndsWhenItsContextEnds(t *testing.T) {
	for _, hold := range []memory.Hold{memory.InProcess, memory.Native} {
		t.Run(holdName(hold), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: hold})
				raw, err := memhook.Of(w.b).SubscriptionDriver("s")
				if err != nil {
					t.Fatal(err)
				}
				var logs logBuf
				s, err := subscribe.New(raw, &subscribe.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil)), ShutdownTimeout: time.Hour})
				if err != nil {
					t.Fatal(err)
				}
				release := make(chan struct{})
				defer func() {
					close(release) // the handler ends, and its lane
					synctest.Wait()
				}()
				started := make(chan struct{})
				done := make(chan error, 1)
				go func() {
					done <- s.Run(context.Background(), func(ctx context.Context, d *keyorder.Delivery) error {
						close(started)
						<-release // ignores ctx
						return nil
					})
				}()
				w.publish(t, "m1", "k")
				<-started
				time.Sleep(3 * time.Second)
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				closed := make(chan error, 1)
				go func() { closed <- s.Close(ctx) }()
				time.Sleep(2 * time.Second) // Close's context ends meanwhile
				synctest.Wait()
				select {
				case err := <-closed:
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("Close = %v, want DeadlineExceeded", err)
					}
				default:
					t.Fatal("Close still blocked after its context ended, while the handler ignores its own")
				}
				select {
				case err := <-done:
					if err != nil {
						t.Errorf("Run: %v", err)
					}
				default:
					t.Fatal("Run has not returned after Close's context ended")
				}
				line := logs.String()
				for _, want := range []string{"key=k", "id=m1", "running=4s"} {
					if !strings.Contains(line, want) {
						t.Errorf("log %q does not name the running handler (%s)", line, want)
					}
				}
			})
		})
	}
}

// TestCloseFromHandler: a handler that calls Close with its own context
// (stop consuming) does not wait for itself: Close returns nil, the
// handler returns, and Run returns. Before the fix it deadlocked.
func TestCloseFromHandler(t *testing.T) {
	for _, hold := range []memory.Hold{memory.InProcess, memory.Native} {
		t.Run(holdName(hold), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: hold})
				drv := openCounted(t, w)
				s, err := subscribe.New(drv, &subscribe.Config{Logger: quiet})
				if err != nil {
					t.Fatal(err)
				}
				closeErr := make(chan error, 1)
				done := make(chan error, 1)
				go func() {
					done <- s.Run(context.Background(), func(ctx context.Context, d *keyorder.Delivery) error {
						if d.ID == "fatal" {
							closeErr <- s.Close(ctx)
						}
						return nil
					})
				}()
				w.publish(t, "m1", "k")
				w.publish(t, "fatal", "k")
				time.Sleep(time.Second) // the shutdown's polls (drain) see it done
				synctest.Wait()
				select {
				case err := <-closeErr:
					if err != nil {
						t.Errorf("Close from a handler = %v, want nil", err)
					}
				default:
					t.Fatal("Close called from a handler has not returned")
				}
				select {
				case err := <-done:
					if err != nil {
						t.Errorf("Run: %v", err)
					}
				default:
					t.Fatal("Run has not returned after a handler called Close")
				}
				synctest.Wait()
				if n := drv.closes.Load(); n != 1 {
					t.Errorf("driver closed %d times, want 1", n)
				}
				if err := s.Close(context.Background()); !errors.Is(err, keyorder.ErrClosed) {
					t.Errorf("second Close = %v, want ErrClosed", err)
				}
			})
		})
	}
}

// reportsLost reports one message's lease lost at the next renewal, once,
// while the broker still leases it and every other: as Pub/Sub, which
// keeps a deadline per delivery, may report one delivery of a key lost
// while a later one of the key is still leased.
type reportsLost struct {
	driver.Subscription
	mu sync.Mutex
	id string
}

func (r *reportsLost) lose(id string) {
	r.mu.Lock()
	r.id = id
	r.mu.Unlock()
}

func (r *reportsLost) ExtendLeases(ctx context.Context, ms []*driver.Message) ([]*driver.Message, error) {
	lost, err := r.Subscription.ExtendLeases(ctx, ms)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range ms {
		if r.id != "" && m.ID == r.id {
			lost = append(lost, m)
			r.id = ""
		}
	}
	return lost, err
}

// TestLostLeaseAloneHoldsLaterMessagesOfItsKey: under in-process hold, when
// the lease of k1 alone is lost while k2 (received after it) is still
// leased, k2 does not run before k1's redelivery has run: the handler
// starts k1, k1 (redelivered), then k2, under Run and RunBatch (MaxSize
// 1). Before the fix: start k1@1, start k2@1, done k2, start k1@2.
func TestLostLeaseAloneHoldsLaterMessagesOfItsKey(t *testing.T) {
	for _, batch := range []bool{false, true} {
		name := "Run"
		if batch {
			name = "RunBatch"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: memory.InProcess, LeaseDuration: 9 * time.Second})
				raw, err := memhook.Of(w.b).SubscriptionDriver("s")
				if err != nil {
					t.Fatal(err)
				}
				drv := &reportsLost{Subscription: raw}
				publishAll(t, w, "K", "k1", "k2")
				var log startLog
				var done []string
				var mu sync.Mutex
				handle := func(ctx context.Context, d *keyorder.Delivery) error {
					log.add(fmt.Sprintf("%s@%d", d.ID, d.Attempt))
					if d.ID == "k1" && d.Attempt == 1 {
						drv.lose("k1")
						<-ctx.Done()
						return ctx.Err()
					}
					mu.Lock()
					done = append(done, d.ID)
					mu.Unlock()
					return nil
				}
				s, err := subscribe.New(drv, &subscribe.Config{Logger: quiet, Batch: &subscribe.BatchConfig{MaxSize: 1}})
				if err != nil {
					t.Fatal(err)
				}
				ran := make(chan error, 1)
				go func() {
					if batch {
						ran <- s.RunBatch(context.Background(), func(ctx context.Context, ds []*keyorder.Delivery) error {
							return handle(ctx, ds[0])
						})
					} else {
						ran <- s.Run(context.Background(), handle)
					}
				}()
				time.Sleep(2 * time.Minute)
				synctest.Wait()
				if err := s.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
				if err := <-ran; err != nil {
					t.Fatal(err)
				}
				got := log.get()
				if len(got) < 3 || got[0] != "k1@1" || got[1] != "k1@2" || got[2][:2] != "k2" {
					t.Fatalf("handler starts %v; want k1@1, k1@2, then k2", got)
				}
				mu.Lock()
				defer mu.Unlock()
				if !slices.Equal(done, []string{"k1", "k2"}) {
					t.Fatalf("completions %v; want [k1 k2]", done)
				}
			})
		})
	}
}
