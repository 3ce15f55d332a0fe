package keyordertest_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/keyordertest"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

var quiet = slog.New(slog.DiscardHandler)

// fakeTB captures what Check reports.
type fakeTB struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Error(args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs = append(f.errs, fmt.Sprint(args...))
}

// pipeline is a memory topic "t" with subscription "s", a publisher and a
// recorder.
type pipeline struct {
	b   *memory.Broker
	pub *publish.Publisher
	rec *keyordertest.Recorder
}

func newPipeline(t *testing.T, ordering policy.Ordering) *pipeline {
	t.Helper()
	b := memory.NewBroker()
	if err := b.CreateSubscription("t", "s", &memory.SubscriptionOptions{Ordering: ordering, Lease: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	pub, err := publish.New(memhook.Of(b).TopicDriver("t"), &publish.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close(context.Background()) })
	return &pipeline{b: b, pub: pub, rec: keyordertest.NewRecorder(&keyordertest.RecorderConfig{MaxAttempts: 3})}
}

// publish publishes "label:key" messages in order and records them.
func (p *pipeline) publish(t *testing.T, specs ...string) {
	t.Helper()
	for _, s := range specs {
		label, key, _ := strings.Cut(s, ":")
		m := &keyorder.Message{ID: "id-" + label, Key: key, Payload: []byte(label)}
		if _, err := p.pub.Publish(context.Background(), m); err != nil {
			t.Fatalf("publish %s: %v", s, err)
		}
		p.rec.Published(m)
	}
}

func (p *pipeline) config(workers int, mw ...subscribe.Middleware) *subscribe.Config {
	return &subscribe.Config{
		Workers: workers, Logger: quiet,
		Retry:      policy.Retry{MaxAttempts: 3, MinBackoff: time.Second, MaxBackoff: time.Second, NoJitter: true},
		Middleware: append([]subscribe.Middleware{p.rec.Middleware()}, mw...),
	}
}

func (p *pipeline) wait(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if err := p.rec.WaitResolved(ctx); err != nil {
		t.Fatalf("not every message was resolved: %v", err)
	}
}

// work is a handler that takes a second, as real work would.
func work(ctx context.Context, d *keyorder.Delivery) error {
	time.Sleep(time.Second)
	return nil
}

// A correct pipeline, with failures, a panic and a poison message injected,
// passes, and the report counts what happened.
func TestCorrectPipelinePasses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPipeline(t, policy.Ordered)
		faults := keyordertest.FailHandler(
			keyordertest.Fault{Payload: "a2", Attempt: 1},
			keyordertest.Fault{Payload: "b1", Panic: "boom", Times: 1},
			keyordertest.Fault{Payload: "c2", Err: keyorder.Permanent(errors.New("poison"))},
			keyordertest.Fault{Payload: "c3"}, // fails every attempt: dead letter by budget
		)
		c := keyordertest.StartConsumer(t, p.b, "s", p.config(4, faults), work)
		p.publish(t, "a1:A", "b1:B", "a2:A", "c1:C", "c2:C", "a3:A", "c3:C", "b2:B", "c4:C")
		p.wait(t)
		rep := keyordertest.Check(t, p.rec, keyordertest.Spec{Ordering: policy.Ordered})
		want := map[keyordertest.Outcome]int{
			keyordertest.Ack: 7, keyordertest.Retry: 1 + 2, keyordertest.Panic: 1,
			keyordertest.DeadPermanent: 1, keyordertest.DeadBudget: 1,
		}
		if fmt.Sprint(rep.Outcomes) != fmt.Sprint(want) {
			t.Errorf("outcomes %v, want %v", rep.Outcomes, want)
		}
		if rep.Messages != 9 || rep.Handlings != 13 || len(rep.Violations) != 0 || len(rep.Duplicates) != 0 {
			t.Errorf("report %+v", rep)
		}
		ids, err := keyordertest.DeadLetterIDs(context.Background(), c.Subscriber)
		if err != nil || !slices.Equal(ids, []string{"id-c2", "id-c3"}) {
			t.Errorf("DeadLetterIDs: %v, %v; want c2 and c3", ids, err)
		}
	})
}

// async is a broken middleware: it acknowledges at once and runs the
// handler in the background, so two messages of a key run together.
func async(next subscribe.HandlerFunc) subscribe.HandlerFunc {
	return func(ctx context.Context, d *keyorder.Delivery) error {
		go next(context.WithoutCancel(ctx), d)
		return nil
	}
}

// The kit catches a pipeline that runs two messages of a key at once, and
// says which key, which messages and when.
func TestCatchesConcurrentHandling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPipeline(t, policy.Ordered)
		cfg := p.config(2)
		// The broken wrapper sits outside the recorder, as a user's own
		// middleware would sit outside their handler.
		cfg.Middleware = []subscribe.Middleware{async, p.rec.Middleware()}
		keyordertest.StartConsumer(t, p.b, "s", cfg, work)
		p.publish(t, "a1:A", "a2:A", "a3:A")
		p.wait(t)
		ft := &fakeTB{}
		rep := keyordertest.Check(ft, p.rec, keyordertest.Spec{Ordering: policy.Ordered})
		if len(ft.errs) != 1 {
			t.Fatalf("Check reported %q, want one error", ft.errs)
		}
		t.Logf("the kit says:\n%s", ft.errs[0])
		// Which of a1 and a2 the broken wrapper's goroutines start first is
		// up to the scheduler: the first violation is then the overlap, or
		// a2 first handled before a1; the overlap is reported either way.
		if !strings.Contains(ft.errs[0], `rule broken (and `) || !strings.Contains(ft.errs[0], `key "A": message a`) ||
			!strings.Contains(ft.errs[0], `handlings of key "A":`) {
			t.Errorf("Check's message does not explain the violation:\n%s", ft.errs[0])
		}
		overlap := regexp.MustCompile(`^key "A": message (a\d) \(ID id-a\d\) \(attempt 1\) started at \+0s while message (a\d) \(ID id-a\d\) \(attempt 1\), started at \+0s, was still being handled \(it returned only at \+1s\)`)
		found := false
		for _, v := range rep.Violations {
			if v.Rule == keyordertest.RuleOverlap && overlap.MatchString(v.Explanation) {
				found = true
			}
		}
		if !found {
			t.Errorf("no overlap violation explained as %v among %v", overlap, rep.Violations)
		}
	})
}

// The kit catches a subscription configured Exclusive where the
// application needs Ordered: a2 overtakes a1's retry.
func TestCatchesWrongPolicy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPipeline(t, policy.Exclusive)
		keyordertest.StartConsumer(t, p.b, "s", p.config(2, keyordertest.FailHandler(keyordertest.Fault{Payload: "a1", Times: 1})), work)
		p.publish(t, "a1:A", "a2:A")
		p.wait(t)
		keyordertest.Check(t, p.rec, keyordertest.Spec{Ordering: policy.Exclusive})
		_, err := keyordertest.Verify(p.rec.History(), keyordertest.Spec{Ordering: policy.Ordered})
		want := `keyordertest: head of line rule broken: key "A": message a2 (ID id-a2) (attempt 1) started at +0s while message a1 (ID id-a1), published before it, was unresolved: it was resolved only at +2s (ack)`
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Fatalf("Verify as Ordered: %v\nwant %s", err, want)
		}
	})
}

// A fake subscriber that handles each batch newest first is caught by the
// first-handling order rule.
func TestCatchesReorderingSubscriber(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPipeline(t, policy.Parallel)
		p.publish(t, "a1:A", "b1:B", "a2:A", "a3:A")
		drv, err := memhook.Of(p.b).SubscriptionDriver("s")
		if err != nil {
			t.Fatal(err)
		}
		h := p.rec.Middleware()(work)
		ms, err := drv.Receive(context.Background(), 10)
		if err != nil || len(ms) != 4 {
			t.Fatalf("received %d, %v", len(ms), err)
		}
		for _, m := range slices.Backward(ms) {
			h(context.Background(), &keyorder.Delivery{Message: keyorder.Message{ID: m.ID, Key: m.Key, Payload: m.Payload}, Attempt: m.Attempt})
		}
		drv.Ack(context.Background(), ms)
		keyordertest.Check(t, p.rec, keyordertest.Spec{Ordering: policy.Parallel})
		_, err = keyordertest.Verify(p.rec.History(), keyordertest.Spec{Ordering: policy.Ordered})
		want := `keyordertest: first-handling order rule broken (and 2 more): key "A": message a3 (ID id-a3) was first handled at +0s, before message a2 (ID id-a2), which was published before it and first handled only at +1s`
		if err == nil || err.Error() != want {
			t.Fatalf("Verify as Ordered: %v\nwant %s", err, want)
		}
	})
}

// Losing a consumer mid-handling and starting its replacement keeps the
// guarantee: a1 is redelivered (attempt 2) before a2, and its first,
// unsettled handling is counted as a duplicate.
func TestLostConsumerRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPipeline(t, policy.Ordered)
		release := make(chan struct{})
		var once sync.Once
		h := func(ctx context.Context, d *keyorder.Delivery) error {
			if string(d.Payload) == "a1" && d.Attempt == 1 {
				<-release // the process dies while a1 runs
			}
			return work(ctx, d)
		}
		c := keyordertest.StartConsumer(t, p.b, "s", p.config(2), h)
		p.publish(t, "a1:A", "a2:A", "b1:B")
		synctest.Wait()
		go func() { time.Sleep(time.Second); once.Do(func() { close(release) }) }()
		c2 := c.Restart()
		p.wait(t)
		rep := keyordertest.Check(t, p.rec, keyordertest.Spec{Ordering: policy.Ordered})
		var a1 []int
		for _, x := range p.rec.History().Handlings {
			if x.Label == "a1" {
				a1 = append(a1, x.Attempt)
			}
		}
		if !slices.Equal(a1, []int{1, 2}) || rep.Duplicates["id-a1"] != 1 {
			t.Errorf("a1 handled at attempts %v, duplicates %v; want attempts [1 2] and one duplicate (the crashed consumer's ack never landed)", a1, rep.Duplicates)
		}
		c2.Stop()
	})
}

// Publish faults: a key's send fails and pauses the key; other keys and
// later sends go through.
func TestFailPublishes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPipeline(t, policy.Ordered)
		stop := keyordertest.FailPublishes(p.b, "t",
			keyordertest.PublishFault{Keys: []string{"A"}, Times: 1},
			keyordertest.PublishFault{Calls: []int{3}, Err: errors.New("third send lost")})
		defer stop()
		ctx := context.Background()
		_, err := p.pub.Publish(ctx, &keyorder.Message{Key: "A", Payload: []byte("a1")})
		if !errors.Is(err, keyordertest.ErrInjected) {
			t.Fatalf("publish a1: %v, want ErrInjected", err)
		}
		if _, err := p.pub.Publish(ctx, &keyorder.Message{Key: "A", Payload: []byte("a2")}); !errors.Is(err, keyorder.ErrKeyPaused) {
			t.Fatalf("publish a2: %v, want the key paused", err)
		}
		if _, err := p.pub.Publish(ctx, &keyorder.Message{Key: "B", Payload: []byte("b1")}); err != nil {
			t.Fatalf("publish b1: %v", err)
		}
		if _, err := p.pub.Publish(ctx, &keyorder.Message{Key: "B", Payload: []byte("b2")}); err == nil || !strings.Contains(err.Error(), "third send lost") {
			t.Fatalf("publish b2 (the third send): %v", err)
		}
	})
}

// A handler cancelled by shutdown is recorded Abandoned: it decided
// nothing, so its message is unresolved, and the report says why.
func TestShutdownAbandons(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPipeline(t, policy.Ordered)
		cfg := p.config(2)
		cfg.ShutdownTimeout = time.Second
		c := keyordertest.StartConsumer(t, p.b, "s", cfg, func(ctx context.Context, d *keyorder.Delivery) error {
			<-ctx.Done()
			return ctx.Err()
		})
		p.publish(t, "a1:A")
		synctest.Wait()
		c.Stop()
		rep, err := keyordertest.Verify(p.rec.History(), keyordertest.Spec{Ordering: policy.Ordered})
		if rep.Outcomes[keyordertest.Abandoned] != 1 {
			t.Errorf("outcomes %v, want one abandoned", rep.Outcomes)
		}
		want := `keyordertest: resolved rule broken: key "A": message a1 (ID id-a1) was neither acknowledged nor dead-lettered: it was handled once (attempt 1), started at +0s: abandoned (context cancelled) (context canceled)`
		if err == nil || err.Error() != want {
			t.Errorf("Verify: %v\nwant %s", err, want)
		}
		if _, err := keyordertest.Verify(p.rec.History(), keyordertest.Spec{Ordering: policy.Ordered, Unfinished: true}); err != nil {
			t.Errorf("Verify with Unfinished: %v", err)
		}
	})
}
