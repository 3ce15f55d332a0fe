package publish_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
)

// step is one SendBatch of a stepTopic, waiting for the test's answer.
type step struct {
	payloads []string
	reply    chan error // nil: send to the broker; an error: fail the batch
}

// stepTopic hands every SendBatch to the test and does what it answers.
type stepTopic struct {
	driver.Topic
	steps chan step
}

func (s *stepTopic) SendBatch(ctx context.Context, ms []*driver.Message) error {
	st := step{payloads: payloads(ms), reply: make(chan error)}
	s.steps <- st
	select {
	case err := <-st.reply:
		if err != nil {
			return err
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Topic.SendBatch(ctx, ms)
}

// next returns the next send, failing the test if none is waiting.
func (s *stepTopic) next(t *testing.T) step {
	t.Helper()
	synctest.Wait()
	select {
	case st := <-s.steps:
		return st
	default:
		t.Fatal("no send is waiting")
		return step{}
	}
}

// idle fails the test if a send is waiting.
func (s *stepTopic) idle(t *testing.T) {
	t.Helper()
	synctest.Wait()
	select {
	case st := <-s.steps:
		t.Fatalf("unexpected send of %v", st.payloads)
	default:
	}
}

// stepSetup returns a publisher over a stepTopic and the subscription that
// sees what reached the broker.
func stepSetup(t *testing.T, cfg *publish.Config) (*publish.Publisher, *stepTopic, memhook.Subscription) {
	t.Helper()
	b := memory.NewBroker()
	if err := b.CreateSubscription("t", "s", &memory.SubscriptionOptions{Ordering: policy.Parallel, MaxBatch: 1000}); err != nil {
		t.Fatal(err)
	}
	st := &stepTopic{Topic: memhook.Of(b).TopicDriver("t"), steps: make(chan step, 100)}
	p, err := publish.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := memhook.Of(b).SubscriptionDriver("s")
	if err != nil {
		t.Fatal(err)
	}
	return p, st, s
}

// asyncCall runs PublishAsync in a goroutine; the Result arrives on the
// channel once PublishAsync returns.
func asyncCall(p *publish.Publisher, ctx context.Context, m *keyorder.Message) chan *publish.Result {
	ch := make(chan *publish.Result, 1)
	go func() { ch <- p.PublishAsync(ctx, m) }()
	return ch
}

// returned reports whether the PublishAsync behind ch has returned, and
// its Result.
func returned(ch chan *publish.Result) (*publish.Result, bool) {
	synctest.Wait()
	select {
	case r := <-ch:
		return r, true
	default:
		return nil, false
	}
}

func settled(r *publish.Result) bool {
	select {
	case <-r.Ready():
		return true
	default:
		return false
	}
}

func msg(id, key, payload string) *keyorder.Message {
	return &keyorder.Message{ID: id, Key: key, Payload: []byte(payload)}
}

// One goroutine publishing asynchronously: every key's messages reach the
// broker in call order, one batch per key in flight, and what queued while
// a batch was in flight went in its next batch.
func TestPublishAsyncKeepsOrderAndBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := memory.NewBroker()
		ot := &orderTopic{Topic: memhook.Of(b).TopicDriver("t"), inflight: map[string]int{}, sent: map[string][]string{}}
		p, err := publish.New(ot, &publish.Config{MaxBatch: 16})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close(context.Background())
		ctx := context.Background()
		const keys, perKey = 4, 250
		var results []*publish.Result
		for i := range perKey {
			for k := range keys {
				results = append(results, p.PublishAsync(ctx, msg("", fmt.Sprint("k", k), fmt.Sprintf("%04d", i))))
			}
		}
		ids := map[string]bool{}
		for i, r := range results {
			id, err := r.Get(ctx)
			if err != nil {
				t.Fatalf("result %d: %v", i, err)
			}
			if id == "" || ids[id] {
				t.Fatalf("result %d: ID %q empty or repeated", i, id)
			}
			ids[id] = true
		}
		if ot.bad.Load() {
			t.Fatal("two batches of one key were in flight at once")
		}
		for k := range keys {
			got := ot.sent[fmt.Sprint("k", k)]
			if len(got) != perKey || !slices.IsSorted(got) {
				t.Fatalf("key k%d: %d sent, in order %v", k, len(got), slices.IsSorted(got))
			}
		}
		// 16 per batch at most: 16 batches per key when everything queued
		// behind the first is batched; one per message if nothing is.
		if n := ot.batches.Load(); n > keys*(perKey/16+2) {
			t.Errorf("%d batches for %d messages: what queued behind a batch in flight was not batched", n, keys*perKey)
		}
	})
}

// A failed batch fails it with the broker's error, everything queued behind
// it with ErrKeyPaused (nothing of it sent), and later publishes of the key
// fast; other keys go on.
func TestPublishAsyncFailureFailsQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, st, s := stepSetup(t, &publish.Config{MaxBatch: 1, SendRetries: -1})
		defer p.Close(context.Background())
		ctx := context.Background()
		a1 := p.PublishAsync(ctx, msg("a1", "a", "a1"))
		first := st.next(t)
		a2 := p.PublishAsync(ctx, msg("a2", "a", "a2"))
		a3 := p.PublishAsync(ctx, msg("a3", "a", "a3"))
		b1 := p.PublishAsync(ctx, msg("b1", "b", "b1"))
		bs := st.next(t)
		bs.reply <- nil
		if id, err := b1.Get(ctx); err != nil || id != "b1" {
			t.Fatalf("b1 = %q, %v", id, err)
		}
		if settled(a2) || settled(a3) {
			t.Fatal("a message queued behind a batch in flight settled before it")
		}
		boom := errors.New("broker down")
		first.reply <- boom
		if id, err := a1.Get(ctx); !errors.Is(err, boom) || id != "a1" {
			t.Fatalf("a1 = %q, %v; want a1 and the broker's error", id, err)
		}
		for _, r := range []*publish.Result{a2, a3} {
			id, err := r.Get(ctx)
			var pe *keyorder.KeyPausedError
			if !errors.As(err, &pe) || pe.Key != "a" || !errors.Is(err, boom) || id == "" {
				t.Fatalf("queued behind the failure = %q, %v; want its ID and a KeyPausedError caused by the failure", id, err)
			}
		}
		a4 := p.PublishAsync(ctx, msg("a4", "a", "a4"))
		if !settled(a4) {
			t.Fatal("a publish of a paused key did not fail at once")
		}
		if id, err := a4.Get(ctx); !errors.Is(err, keyorder.ErrKeyPaused) || id != "" {
			t.Fatalf("a4 = %q, %v; want \"\" and ErrKeyPaused", id, err)
		}
		st.idle(t)
		if got := payloads(receiveAll(t, s)); !slices.Equal(got, []string{"b1"}) {
			t.Fatalf("broker got %v, want only b1", got)
		}
		if got := p.Paused(); !slices.Equal(got, []string{"a"}) {
			t.Fatalf("Paused = %v", got)
		}
	})
}

// MaxOutstandingMessages: a publish over the limit blocks in PublishAsync
// until an earlier message settles.
func TestMaxOutstandingMessagesBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, st, s := stepSetup(t, &publish.Config{MaxBatch: 1, MaxOutstandingMessages: 2})
		defer p.Close(context.Background())
		ctx := context.Background()
		m1 := p.PublishAsync(ctx, msg("m1", "k", "m1"))
		s1 := st.next(t)
		m2 := p.PublishAsync(ctx, msg("m2", "k", "m2"))
		other := asyncCall(p, ctx, msg("o1", "other", "o1")) // another key waits too
		if _, ok := returned(other); ok {
			t.Fatal("a third outstanding message was admitted over MaxOutstandingMessages 2")
		}
		st.idle(t)
		s1.reply <- nil
		if _, err := m1.Get(ctx); err != nil {
			t.Fatal(err)
		}
		o1, ok := returned(other)
		if !ok {
			t.Fatal("the blocked publish was not admitted when a message settled")
		}
		// m2 and o1 are in flight now (different keys).
		for range 2 {
			st.next(t).reply <- nil
		}
		for _, r := range []*publish.Result{m2, o1} {
			if _, err := r.Get(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if got := payloads(receiveAll(t, s)); len(got) != 3 {
			t.Fatalf("broker got %v", got)
		}
	})
}

// MaxOutstandingBytes, and FIFO admission: a small publish that would fit
// waits behind a large one that does not; when the large one's context
// ends, the small one is admitted at once.
func TestMaxOutstandingBytesFIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// A message counts payload + key + ID bytes: 2-byte IDs, 1-byte key.
		p, st, s := stepSetup(t, &publish.Config{MaxBatch: 10, MaxOutstandingBytes: 100, MaxOutstandingMessages: -1})
		defer p.Close(context.Background())
		ctx := context.Background()
		first := p.PublishAsync(ctx, msg("m1", "k", strings.Repeat("1", 57))) // 60 bytes
		s1 := st.next(t)
		bigCtx, cancelBig := context.WithCancel(ctx)
		big := asyncCall(p, bigCtx, msg("m2", "k", strings.Repeat("2", 57))) // 60: over
		if _, ok := returned(big); ok {
			t.Fatal("a publish over MaxOutstandingBytes was admitted")
		}
		small := asyncCall(p, ctx, msg("m3", "k", "3333333")) // 10: would fit
		if _, ok := returned(small); ok {
			t.Fatal("a small publish overtook a larger one blocked before it (not FIFO)")
		}
		cancelBig()
		r, ok := returned(big)
		if !ok {
			t.Fatal("a blocked publish did not return when its context ended")
		}
		if id, err := r.Get(ctx); !errors.Is(err, context.Canceled) || id != "" {
			t.Fatalf("cancelled blocked publish = %q, %v", id, err)
		}
		m3, ok := returned(small)
		if !ok {
			t.Fatal("the publish behind a cancelled one was not admitted though it fits")
		}
		s1.reply <- nil
		st.next(t).reply <- nil
		for _, r := range []*publish.Result{first, m3} {
			if _, err := r.Get(ctx); err != nil {
				t.Fatal(err)
			}
		}
		got := payloads(receiveAll(t, s))
		if len(got) != 2 || got[1] != "3333333" {
			t.Fatalf("broker got %v; the cancelled publish must not be sent", got)
		}
	})
}

// A message larger than MaxOutstandingBytes is admitted alone: at once
// when nothing is outstanding, and what comes next waits for it.
func TestOversizedMessageAdmittedAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, st, _ := stepSetup(t, &publish.Config{MaxOutstandingBytes: 10})
		defer p.Close(context.Background())
		ctx := context.Background()
		huge := asyncCall(p, ctx, msg("h", "k", strings.Repeat("x", 100)))
		hr, ok := returned(huge)
		if !ok {
			t.Fatal("a message over MaxOutstandingBytes blocked with nothing outstanding")
		}
		sh := st.next(t)
		next := asyncCall(p, ctx, msg("n", "j", "y"))
		if _, ok := returned(next); ok {
			t.Fatal("a publish was admitted beside an oversized one")
		}
		sh.reply <- nil
		if _, err := hr.Get(ctx); err != nil {
			t.Fatal(err)
		}
		nr, ok := returned(next)
		if !ok {
			t.Fatal("not admitted after the oversized message settled")
		}
		st.next(t).reply <- nil
		if _, err := nr.Get(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// A publish blocked on the limits whose key fails meanwhile fails with
// ErrKeyPaused and sends nothing (even under AutoResume: it was called
// before the failure was known, so sending it would overtake the failed
// message); a blocked publish of another key is admitted.
func TestBlockedPublishOfFailedKeyFails(t *testing.T) {
	for _, auto := range []bool{false, true} {
		t.Run(fmt.Sprintf("AutoResume=%v", auto), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p, st, s := stepSetup(t, &publish.Config{MaxOutstandingMessages: 1, SendRetries: -1, AutoResume: auto})
				defer p.Close(context.Background())
				ctx := context.Background()
				a1 := p.PublishAsync(ctx, msg("a1", "a", "a1"))
				sa := st.next(t)
				a2 := asyncCall(p, ctx, msg("a2", "a", "a2"))
				b1 := asyncCall(p, ctx, msg("b1", "b", "b1"))
				if _, ok := returned(a2); ok {
					t.Fatal("not blocked")
				}
				boom := errors.New("broker down")
				sa.reply <- boom
				if _, err := a1.Get(ctx); !errors.Is(err, boom) {
					t.Fatalf("a1 = %v", err)
				}
				r, ok := returned(a2)
				if !ok {
					t.Fatal("the blocked publish of the failed key still blocks")
				}
				if id, err := r.Get(ctx); !errors.Is(err, keyorder.ErrKeyPaused) || !errors.Is(err, boom) || id != "" {
					t.Fatalf("blocked publish of the failed key = %q, %v", id, err)
				}
				br, ok := returned(b1)
				if !ok {
					t.Fatal("the blocked publish of another key was not admitted")
				}
				st.next(t).reply <- nil
				if _, err := br.Get(ctx); err != nil {
					t.Fatal(err)
				}
				if got := payloads(receiveAll(t, s)); !slices.Equal(got, []string{"b1"}) {
					t.Fatalf("broker got %v", got)
				}
				a3 := p.PublishAsync(ctx, msg("a3", "a", "a3"))
				if auto {
					st.next(t).reply <- nil
					if _, err := a3.Get(ctx); err != nil {
						t.Fatalf("after AutoResume: %v", err)
					}
				} else if _, err := a3.Get(ctx); !errors.Is(err, keyorder.ErrKeyPaused) {
					t.Fatalf("publish of the paused key = %v", err)
				}
			})
		})
	}
}

// Close fails the publishes blocked on the limits with ErrClosed (nothing
// sent) and still sends what was admitted.
func TestCloseFailsBlockedPublishes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, st, s := stepSetup(t, &publish.Config{MaxOutstandingMessages: 1})
		ctx := context.Background()
		m1 := p.PublishAsync(ctx, msg("m1", "k", "m1"))
		s1 := st.next(t)
		blocked := asyncCall(p, ctx, msg("m2", "k", "m2"))
		closed := make(chan error, 1)
		go func() { closed <- p.Close(ctx) }()
		r, ok := returned(blocked)
		if !ok {
			t.Fatal("Close left a blocked publish blocked")
		}
		if _, err := r.Get(ctx); !errors.Is(err, keyorder.ErrClosed) {
			t.Fatalf("blocked publish at Close = %v", err)
		}
		s1.reply <- nil
		if err := <-closed; err != nil {
			t.Fatal(err)
		}
		if _, err := m1.Get(ctx); err != nil {
			t.Fatal(err)
		}
		if got := payloads(receiveAll(t, s)); !slices.Equal(got, []string{"m1"}) {
			t.Fatalf("broker got %v", got)
		}
		if _, err := p.PublishAsync(ctx, msg("m3", "k", "m3")).Get(ctx); !errors.Is(err, keyorder.ErrClosed) {
			t.Fatalf("PublishAsync after Close = %v", err)
		}
	})
}

// Get with a context that ends returns the ID and ctx.Err(); the message is
// still sent, and Get can be called again.
func TestResultGetContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, st, _ := stepSetup(t, nil)
		defer p.Close(context.Background())
		ctx := context.Background()
		r := p.PublishAsync(ctx, msg("m1", "k", "m1"))
		s1 := st.next(t)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if id, err := r.Get(cctx); !errors.Is(err, context.Canceled) || id != "m1" {
			t.Fatalf("Get with a done context = %q, %v", id, err)
		}
		s1.reply <- nil
		<-r.Ready()
		if id, err := r.Get(cctx); err != nil || id != "m1" {
			t.Fatalf("Get once settled = %q, %v (a settled result wins over a done context)", id, err)
		}
	})
}

// Results already known come back settled: invalid message, done context.
func TestPublishAsyncImmediateErrors(t *testing.T) {
	_, p, _ := setup(t, nil)
	ctx := context.Background()
	r := p.PublishAsync(ctx, &keyorder.Message{Payload: []byte("no key")})
	if !settled(r) {
		t.Fatal("an invalid message's result is not settled")
	}
	if id, err := r.Get(ctx); !errors.Is(err, keyorder.ErrMissingKey) || id != "" {
		t.Fatalf("keyless = %q, %v", id, err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := p.PublishAsync(done, msg("", "k", "x")).Get(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("done context = %v", err)
	}
}

// PublishBatch returns the IDs in slice order and leaves the messages as
// they were; a batch larger than MaxOutstandingMessages is admitted alone.
func TestPublishBatchIDs(t *testing.T) {
	_, p, s := setup(t, &publish.Config{MaxOutstandingMessages: 2})
	ctx := context.Background()
	ms := []*keyorder.Message{msg("", "k", "1"), msg("mine", "k", "2"), msg("", "j", "3"), msg("", "", "4"), msg("", "k", "5")}
	ms[3].Key = "x"
	ids, err := p.PublishBatch(ctx, ms)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 5 || ids[1] != "mine" || ms[0].ID != "" || ms[2].ID != "" {
		t.Fatalf("ids %v; messages' IDs %q %q must stay empty", ids, ms[0].ID, ms[2].ID)
	}
	byPayload := map[string]string{}
	for _, m := range receiveAll(t, s) {
		byPayload[string(m.Payload)] = m.ID
	}
	for i, m := range ms {
		if byPayload[string(m.Payload)] != ids[i] {
			t.Errorf("message %d sent as %q, PublishBatch returned %q", i, byPayload[string(m.Payload)], ids[i])
		}
	}
}

func TestOutstandingDefaults(t *testing.T) {
	c := (*publish.Config)(nil).WithDefaults()
	if c.MaxOutstandingMessages != 100_000 || c.MaxOutstandingBytes != 64<<20 {
		t.Fatalf("defaults %d messages, %d bytes", c.MaxOutstandingMessages, c.MaxOutstandingBytes)
	}
}

// Many goroutines, small limits, real scheduler (race detector): every
// result settles and order holds per key and goroutine.
func TestPublishAsyncConcurrentUnderLimits(t *testing.T) {
	b := memory.NewBroker()
	ot := &orderTopic{Topic: memhook.Of(b).TopicDriver("t"), inflight: map[string]int{}, sent: map[string][]string{}}
	p, err := publish.New(ot, &publish.Config{MaxOutstandingMessages: 7, MaxBatch: 3})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			var rs []*publish.Result
			for i := range 200 {
				rs = append(rs, p.PublishAsync(ctx, msg("", fmt.Sprint("g", g%4), fmt.Sprintf("%d-%04d", g, i))))
			}
			for _, r := range rs {
				if _, err := r.Get(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if ot.bad.Load() {
		t.Fatal("two batches of one key in flight")
	}
	total := 0
	for k, sent := range ot.sent {
		per := map[byte][]string{}
		for _, s := range sent {
			per[s[0]] = append(per[s[0]], s)
			total++
		}
		for g, seq := range per {
			if !slices.IsSorted(seq) {
				t.Fatalf("key %s, goroutine %c: out of order", k, g)
			}
		}
	}
	if total != 1600 {
		t.Fatalf("sent %d of 1600", total)
	}
}
