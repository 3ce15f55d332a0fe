package memory_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
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
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// overwrite fills p with 'X', as a caller reusing its buffer would.
func overwrite(p []byte) {
	for i := range p {
		p[i] = 'X'
	}
}

// SendBatch retains nothing of the caller's messages: a payload buffer or
// headers map reused after it returned does not change what is delivered.
func TestSendBatchDoesNotRetainPayload(t *testing.T) {
	b := memory.NewBroker()
	b.CreateSubscription("t", "s", nil)
	ctx := context.Background()
	buf := []byte("original")
	hs := map[string]string{"h": "v"}
	if err := memhook.Of(b).TopicDriver("t").SendBatch(ctx, []*driver.Message{{ID: "1", Payload: buf, Headers: hs}}); err != nil {
		t.Fatal(err)
	}
	overwrite(buf)
	hs["h"] = "changed"
	c, _ := memhook.Of(b).SubscriptionDriver("s")
	got, err := c.Receive(ctx, 10)
	if err != nil || len(got) != 1 {
		t.Fatalf("Receive = %d messages, %v", len(got), err)
	}
	if string(got[0].Payload) != "original" || got[0].Headers["h"] != "v" {
		t.Fatalf("delivered %q, headers %v; want what was sent", got[0].Payload, got[0].Headers)
	}
}

// Publish on memory: the caller's buffer reused after Publish returned does
// not change what is delivered.
func TestPublishDoesNotRetainPayload(t *testing.T) {
	b := memory.NewBroker()
	b.CreateSubscription("t", "s", nil)
	p, err := publish.New(memhook.Of(b).TopicDriver("t"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	defer p.Close(ctx)
	buf := []byte("original")
	if _, err := p.Publish(ctx, &keyorder.Message{Key: "k", Payload: buf}); err != nil {
		t.Fatal(err)
	}
	overwrite(buf)
	c, _ := memhook.Of(b).SubscriptionDriver("s")
	got, _ := c.Receive(ctx, 10)
	if len(got) != 1 || string(got[0].Payload) != "original" {
		t.Fatalf("delivered %q, want \"original\"", payloadsOf(got))
	}
}

func payloadsOf(ms []*driver.Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, string(m.Payload))
	}
	return out
}

// Each delivery has its own payload: a consumer writing into one changes
// neither another subscription's delivery nor a redelivery of the message.
func TestDeliveryPayloadIsItsOwn(t *testing.T) {
	for _, hold := range []memory.Hold{memory.Native, memory.InProcess} {
		t.Run(holdName(hold), func(t *testing.T) {
			b := memory.NewBroker()
			cfg := &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: hold}
			b.CreateSubscription("t", "s1", cfg)
			b.CreateSubscription("t", "s2", cfg)
			send(t, b, [2]string{"a1", "A"})
			ctx := context.Background()
			c1, _ := memhook.Of(b).SubscriptionDriver("s1")
			c2, _ := memhook.Of(b).SubscriptionDriver("s2")
			got, _ := c1.Receive(ctx, 10)
			if len(got) != 1 {
				t.Fatalf("s1 got %v", payloadsOf(got))
			}
			overwrite(got[0].Payload)
			if err := c1.Release(ctx, got); err != nil {
				t.Fatal(err)
			}
			again, _ := c1.Receive(ctx, 10)
			if len(again) != 1 || string(again[0].Payload) != "a1" {
				t.Fatalf("s1 redelivered %q after its consumer wrote into the payload, want a1", payloadsOf(again))
			}
			other, _ := c2.Receive(ctx, 10)
			if len(other) != 1 || string(other[0].Payload) != "a1" {
				t.Fatalf("s2 got %q after s1's consumer wrote into its payload, want a1", payloadsOf(other))
			}
		})
	}
}

func holdName(h memory.Hold) string {
	if h == memory.InProcess {
		return "inprocess"
	}
	return "native"
}

// Through the whole stack: a handler that writes into Delivery.Payload
// changes neither what another subscription's handler receives nor what
// the retry of the message is handed, whether the broker (Native) or the
// subscriber (InProcess) holds the key for the retry.
func TestHandlerPayloadWritesStayInTheirDelivery(t *testing.T) {
	for _, hold := range []memory.Hold{memory.Native, memory.InProcess} {
		t.Run(holdName(hold), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
				b := memory.NewBroker()
				cfg := &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: hold}
				b.CreateSubscription("t", "s1", cfg)
				b.CreateSubscription("t", "s2", cfg)
				p, err := publish.New(memhook.Of(b).TopicDriver("t"), nil)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if _, err := p.Publish(ctx, &keyorder.Message{Key: "k", Payload: []byte("original")}); err != nil {
					t.Fatal(err)
				}
				p.Close(ctx)

				var mu sync.Mutex
				seen := map[string][]string{} // subscription -> payload per attempt
				errBoom := errors.New("boom")
				handler := func(name string) subscribe.HandlerFunc {
					return func(ctx context.Context, d *keyorder.Delivery) error {
						mu.Lock()
						seen[name] = append(seen[name], string(d.Payload))
						mu.Unlock()
						overwrite(d.Payload)
						if name == "s1" && d.Attempt == 1 {
							return errBoom
						}
						return nil
					}
				}
				var subs []*subscribe.Subscriber
				for _, name := range []string{"s1", "s2"} {
					drv, _ := memhook.Of(b).SubscriptionDriver(name)
					s, err := subscribe.New(drv, &subscribe.Config{Logger: quiet})
					if err != nil {
						t.Fatal(err)
					}
					subs = append(subs, s)
					go s.Run(ctx, handler(name))
				}
				// Let virtual time pass until s1's retry ran and s2 handled
				// the message (the retry waits out a backoff).
				for i := 0; ; i++ {
					synctest.Wait()
					mu.Lock()
					done := len(seen["s1"]) == 2 && len(seen["s2"]) == 1
					mu.Unlock()
					if done {
						break
					}
					if i == 3600 {
						t.Fatalf("after an hour: handled %v", seen)
					}
					time.Sleep(time.Second)
				}
				for _, s := range subs {
					s.Close(context.Background())
				}
				for name, want := range map[string][]string{"s1": {"original", "original"}, "s2": {"original"}} {
					if got := seen[name]; !slices.Equal(got, want) {
						t.Fatalf("%s's handler was handed %q, want %q: another delivery's write reached it", name, got, want)
					}
				}
			})
		})
	}
}

// A batch handler handed a message again (the rest of a batch whose first
// message was dead-lettered) gets the original bytes, whatever it wrote
// into the first batch's payloads.
func TestBatchHandedAgainGetsOriginalPayload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
		b := memory.NewBroker()
		b.CreateSubscription("t", "s", &memory.SubscriptionOptions{Ordering: policy.Ordered, Chain: 2})
		send(t, b, [2]string{"a1", "A"}, [2]string{"a2", "A"})
		drv, _ := memhook.Of(b).SubscriptionDriver("s")
		s, err := subscribe.New(drv, &subscribe.Config{Logger: quiet, Batch: &subscribe.BatchConfig{MaxSize: 2}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var mu sync.Mutex
		var calls [][]string
		go s.RunBatch(ctx, func(ctx context.Context, ds []*keyorder.Delivery) error {
			var ps []string
			for _, d := range ds {
				ps = append(ps, string(d.Payload))
				overwrite(d.Payload)
			}
			mu.Lock()
			calls = append(calls, ps)
			first := len(calls) == 1
			mu.Unlock()
			if first {
				return keyorder.Permanent(errors.New("bad a1"))
			}
			return nil
		})
		for i := 0; ; i++ {
			synctest.Wait()
			mu.Lock()
			n := len(calls)
			mu.Unlock()
			if n == 2 {
				break
			}
			if i == 3600 {
				t.Fatalf("after an hour: calls %q", calls)
			}
			time.Sleep(time.Second)
		}
		s.Close(context.Background())
		if want := [][]string{{"a1", "a2"}, {"a2"}}; !slices.EqualFunc(calls, want, slices.Equal) {
			t.Fatalf("batches handed %q, want %q", calls, want)
		}
	})
}
