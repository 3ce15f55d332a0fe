package watermill_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/keyorder/keyorder"
	wmk "github.com/keyorder/keyorder/adapters/watermill"
	"github.com/keyorder/keyorder/policy"
)

// history records, per key, the messages a handler ran, and checks that no
// two messages of a key ran at once.
type history struct {
	mu      sync.Mutex
	runs    map[string][]string
	running map[string]int
	overlap []string
}

func newHistory() *history {
	return &history{runs: map[string][]string{}, running: map[string]int{}}
}

func (h *history) enter(m *message.Message) string {
	key := m.Metadata.Get(keyorder.HeaderPartitionKey)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.runs[key] = append(h.runs[key], m.UUID)
	if h.running[key]++; h.running[key] > 1 {
		h.overlap = append(h.overlap, m.UUID)
	}
	return key
}

func (h *history) exit(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.running[key]--
}

func (h *history) get() map[string][]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string][]string{}
	for k, v := range h.runs {
		out[k] = slices.Clone(v)
	}
	return out
}

// router runs a Watermill router over gochannel with the given middleware
// (first outermost) and handler, inside a synctest bubble; publish sends one
// message and waits until everything is blocked, so messages arrive in the
// order they are published.
type routerEnv struct {
	t      *testing.T
	pubsub *gochannel.GoChannel
	stop   func()
}

func startRouter(t *testing.T, mws []message.HandlerMiddleware, h message.NoPublishHandlerFunc) *routerEnv {
	t.Helper()
	logger := watermill.NopLogger{}
	ps := gochannel.NewGoChannel(gochannel.Config{}, logger)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: time.Minute}, logger)
	if err != nil {
		t.Fatal(err)
	}
	r.AddMiddleware(mws...)
	r.AddConsumerHandler("h", "in", ps, h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	<-r.Running()
	return &routerEnv{t: t, pubsub: ps, stop: func() {
		cancel()
		<-done
		ps.Close()
	}}
}

func (e *routerEnv) publish(uuid, key string) {
	e.t.Helper()
	if err := e.pubsub.Publish("in", msg(uuid, key, "x")); err != nil {
		e.t.Fatal(err)
	}
	synctest.Wait()
}

// Under Ordered a failed message is retried in place (with backoff) before
// anything behind it in its key; other keys run meanwhile; no two messages
// of a key run at once.
func TestMiddlewareOrderedWithFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		km, err := wmk.NewMiddleware(policy.Ordered, &wmk.MiddlewareConfig{
			Retry: policy.Retry{MinBackoff: time.Second, MaxBackoff: time.Second, NoJitter: true},
		})
		if err != nil {
			t.Fatal(err)
		}
		hist := newHistory()
		fails := map[string]int{"a1": 2, "b2": 1}
		var mu sync.Mutex
		env := startRouter(t, []message.HandlerMiddleware{km.Middleware}, func(m *message.Message) error {
			key := hist.enter(m)
			defer hist.exit(key)
			time.Sleep(10 * time.Millisecond) // work: lets a key's successors queue up behind it
			mu.Lock()
			defer mu.Unlock()
			if fails[m.UUID] > 0 {
				fails[m.UUID]--
				return errors.New("boom")
			}
			return nil
		})
		for _, p := range [][2]string{{"a1", "A"}, {"a2", "A"}, {"b1", "B"}, {"a3", "A"}, {"b2", "B"}, {"b3", "B"}} {
			env.publish(p[0], p[1])
		}
		// B runs while a1 waits for its retries.
		if got := hist.get()["B"]; !slices.Contains(got, "b1") {
			t.Fatalf("B history %v before a1's retry: held by A", got)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		env.stop()
		km.Close(context.Background())
		want := map[string][]string{
			"A": {"a1", "a1", "a1", "a2", "a3"},
			"B": {"b1", "b2", "b2", "b3"},
		}
		if got := hist.get(); !maps.EqualFunc(got, want, slices.Equal) {
			t.Errorf("histories %v, want %v", got, want)
		}
		if len(hist.overlap) > 0 {
			t.Errorf("messages ran beside another of their key: %v", hist.overlap)
		}
	})
}

// The recommended stack, outermost first: PoisonQueue, the keyorder
// middleware, Retry, Recoverer. A panicking message is retried by Retry
// while its key is held, then in place by keyorder, then goes to the
// poison queue, and only then does its key move on.
func TestMiddlewareComposesWithRetryRecovererPoisonQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		km, err := wmk.NewMiddleware(policy.Ordered, &wmk.MiddlewareConfig{
			Retry: policy.Retry{MaxAttempts: 2, MinBackoff: time.Second, MaxBackoff: time.Second, NoJitter: true},
		})
		if err != nil {
			t.Fatal(err)
		}
		poisonPS := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
		pq, err := middleware.PoisonQueue(poisonPS, "poison")
		if err != nil {
			t.Fatal(err)
		}
		retry := middleware.Retry{MaxRetries: 2, InitialInterval: 100 * time.Millisecond}
		hist := newHistory()
		env := startRouter(t, []message.HandlerMiddleware{pq, km.Middleware, retry.Middleware, middleware.Recoverer},
			func(m *message.Message) error {
				key := hist.enter(m)
				defer hist.exit(key)
				if m.UUID == "a1" {
					panic("a1 is poison")
				}
				return nil
			})
		for _, p := range [][2]string{{"a1", "A"}, {"a2", "A"}, {"b1", "B"}} {
			env.publish(p[0], p[1])
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		env.stop()
		km.Close(context.Background())
		// 2 keyorder attempts × (1 try + 2 Retry retries), then a2.
		want := map[string][]string{
			"A": {"a1", "a1", "a1", "a1", "a1", "a1", "a2"},
			"B": {"b1"},
		}
		if got := hist.get(); !maps.EqualFunc(got, want, slices.Equal) {
			t.Errorf("histories %v, want %v", got, want)
		}
		poisoned, err := poisonPS.Subscribe(context.Background(), "poison")
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		select {
		case m := <-poisoned:
			if m.UUID != "a1" || m.Metadata.Get(middleware.ReasonForPoisonedKey) == "" {
				t.Errorf("poison queue got %s %v", m.UUID, m.Metadata)
			}
			m.Ack()
		default:
			t.Error("a1 not in the poison queue")
		}
		poisonPS.Close()
	})
}

// Exclusive: one message of a key at a time, and a failed message waiting
// for its retry lets the key's later messages run first.
func TestMiddlewareExclusive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		km, err := wmk.NewMiddleware(policy.Exclusive, &wmk.MiddlewareConfig{
			Retry: policy.Retry{MinBackoff: time.Second, MaxBackoff: time.Second, NoJitter: true},
		})
		if err != nil {
			t.Fatal(err)
		}
		hist := newHistory()
		failed := false
		env := startRouter(t, []message.HandlerMiddleware{km.Middleware}, func(m *message.Message) error {
			key := hist.enter(m)
			defer hist.exit(key)
			time.Sleep(10 * time.Millisecond)
			if m.UUID == "a1" && !failed {
				failed = true
				return errors.New("boom")
			}
			return nil
		})
		env.publish("a1", "A")
		env.publish("a2", "A")
		time.Sleep(time.Minute)
		synctest.Wait()
		env.stop()
		km.Close(context.Background())
		if got, want := hist.get()["A"], []string{"a1", "a2", "a1"}; !slices.Equal(got, want) {
			t.Errorf("A history %v, want %v", got, want)
		}
		if len(hist.overlap) > 0 {
			t.Errorf("messages ran beside another of their key: %v", hist.overlap)
		}
	})
}

// Without a partition-key, KeyFunc decides; keyless messages run freely.
func TestMiddlewareKeyFunc(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		km, err := wmk.NewMiddleware(policy.Ordered, &wmk.MiddlewareConfig{
			KeyFunc: func(m *message.Message) string { return m.Metadata.Get("acct") },
		})
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		running, maxRunning := 0, 0
		h := km.Middleware(func(m *message.Message) ([]*message.Message, error) {
			mu.Lock()
			running++
			maxRunning = max(maxRunning, running)
			mu.Unlock()
			time.Sleep(time.Second)
			mu.Lock()
			running--
			mu.Unlock()
			return nil, nil
		})
		var wg sync.WaitGroup
		for i, acct := range []string{"A", "A", "", ""} {
			m := message.NewMessage(fmt.Sprint(i), nil)
			if acct != "" {
				m.Metadata.Set("acct", acct)
			}
			wg.Go(func() { h(m) })
		}
		synctest.Wait()
		mu.Lock()
		got := running
		mu.Unlock()
		if got != 3 { // one of A, both keyless
			t.Errorf("%d running at once, want 3", got)
		}
		wg.Wait()
		km.Close(context.Background())
	})
}
