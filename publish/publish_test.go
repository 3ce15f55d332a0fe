package publish_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
)

func setup(t *testing.T, cfg *publish.Config) (*memory.Broker, *publish.Publisher, memhook.Subscription) {
	t.Helper()
	b := memory.NewBroker()
	if err := b.CreateSubscription("t", "s", &memory.SubscriptionOptions{Ordering: policy.Parallel, MaxBatch: 1000}); err != nil {
		t.Fatal(err)
	}
	p, err := publish.New(memhook.Of(b).TopicDriver("t"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	s, err := memhook.Of(b).SubscriptionDriver("s")
	if err != nil {
		t.Fatal(err)
	}
	return b, p, s
}

func receiveAll(t *testing.T, s memhook.Subscription) []*driver.Message {
	t.Helper()
	ms, err := s.Receive(context.Background(), 1000)
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

func TestKeyResolution(t *testing.T) {
	_, p, s := setup(t, &publish.Config{Key: "fixed"})
	ctx := context.Background()
	msgs := []*keyorder.Message{
		{Key: "explicit", Headers: map[string]string{keyorder.HeaderPartitionKey: "header", "x": "1"}},
		{Headers: map[string]string{keyorder.HeaderPartitionKey: "header"}},
		{},
	}
	var ids []string
	for _, m := range msgs {
		id, err := p.Publish(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		if u, err := uuid.Parse(id); err != nil || u.Version() != 7 {
			t.Fatalf("assigned ID %q is not a UUIDv7", id)
		}
		if m.ID != "" || m.Key != msgs[0].Key && m.Key != "" {
			t.Fatalf("Publish modified the caller's message: %+v", m)
		}
		ids = append(ids, id)
	}
	got := receiveAll(t, s)
	var keys []string
	for i, m := range got {
		if m.ID != ids[i] {
			t.Errorf("message %d sent with ID %q, Publish returned %q", i, m.ID, ids[i])
		}
		keys = append(keys, m.Key)
		if _, ok := m.Headers[keyorder.HeaderPartitionKey]; ok {
			t.Errorf("the key travelled as a header: %v", m.Headers)
		}
	}
	if !slices.Equal(keys, []string{"explicit", "header", "fixed"}) {
		t.Fatalf("keys = %v", keys)
	}
	if got[0].Headers["x"] != "1" {
		t.Fatalf("user header lost: %v", got[0].Headers)
	}
	if _, ok := msgs[0].Headers[keyorder.HeaderPartitionKey]; !ok {
		t.Fatal("Publish modified the caller's headers")
	}
}

// orderTopic checks one batch in flight per key and records what was sent.
type orderTopic struct {
	driver.Topic
	mu       sync.Mutex
	inflight map[string]int
	bad      atomic.Bool
	batches  atomic.Int64
	sent     map[string][]string
}

func (o *orderTopic) SendBatch(ctx context.Context, ms []*driver.Message) error {
	key := ms[0].Key
	o.mu.Lock()
	o.inflight[key]++
	if key != "" && o.inflight[key] > 1 {
		o.bad.Store(true)
	}
	o.mu.Unlock()
	time.Sleep(time.Millisecond) // the broker's round trip, on the fake clock
	err := o.Topic.SendBatch(ctx, ms)
	o.mu.Lock()
	o.inflight[key]--
	for _, m := range ms {
		o.sent[key] = append(o.sent[key], string(m.Payload))
	}
	o.mu.Unlock()
	o.batches.Add(1)
	return err
}

func TestOneBatchPerKeyInFlight(t *testing.T) {
	synctest.Test(t, testOneBatchPerKeyInFlight)
}

func testOneBatchPerKeyInFlight(t *testing.T) {
	b := memory.NewBroker()
	ot := &orderTopic{Topic: memhook.Of(b).TopicDriver("t"), inflight: map[string]int{}, sent: map[string][]string{}}
	p, err := publish.New(ot, &publish.Config{MaxBatch: 16})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	const perKey = 300
	// Per key, one goroutine publishes in sequence (order must hold) while
	// others pile onto the same key concurrently (batching must happen).
	for k := range 4 {
		key := fmt.Sprint("k", k)
		wg.Go(func() {
			for i := range perKey {
				if _, err := p.Publish(ctx, &keyorder.Message{Key: key, Payload: fmt.Appendf(nil, "seq-%04d", i)}); err != nil {
					t.Error(err)
				}
			}
		})
		for range 4 {
			wg.Go(func() {
				for range perKey / 4 {
					if _, err := p.Publish(ctx, &keyorder.Message{Key: key, Payload: []byte("noise")}); err != nil {
						t.Error(err)
					}
				}
			})
		}
	}
	wg.Wait()
	if ot.bad.Load() {
		t.Fatal("two batches of one key were in flight at once")
	}
	total := 0
	for k := range 4 {
		var seq []string
		for _, s := range ot.sent[fmt.Sprint("k", k)] {
			total++
			if s != "noise" {
				seq = append(seq, s)
			}
		}
		if !slices.IsSorted(seq) || len(seq) != perKey {
			t.Fatalf("key k%d sent out of order or incomplete (%d)", k, len(seq))
		}
	}
	if n := ot.batches.Load(); n >= int64(total) {
		t.Errorf("%d batches for %d messages: concurrent publishes of a key were not batched", n, total)
	}
}

func TestFailedPublishPausesOnlyItsKey(t *testing.T) {
	b, p, s := setup(t, nil)
	ctx := context.Background()
	boom := errors.New("broker down")
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	memhook.Of(b).FailSends("t", func(ms []*driver.Message) error {
		if ms[0].Key != "bad" {
			return nil
		}
		entered <- struct{}{}
		<-release
		return boom
	})
	first := make(chan error, 1)
	go func() { _, err := p.Publish(ctx, &keyorder.Message{Key: "bad", Payload: []byte("1")}); first <- err }()
	<-entered
	// Queued behind the failing batch: they must fail without being sent.
	behind := make(chan error, 3)
	for i := range 3 {
		go func() {
			_, err := p.Publish(ctx, &keyorder.Message{Key: "bad", Payload: fmt.Appendf(nil, "b%d", i)})
			behind <- err
		}()
	}
	if _, err := p.Publish(ctx, &keyorder.Message{Key: "good", Payload: []byte("g")}); err != nil {
		t.Fatalf("another key was held by the failing one: %v", err)
	}
	close(release)
	if err := <-first; !errors.Is(err, boom) {
		t.Fatalf("failed publish = %v", err)
	}
	var ke *keyorder.Error
	for range 3 {
		err := <-behind
		// A publish that raced in before the failure is paused; one that
		// arrived after it fails fast the same way.
		if !errors.Is(err, keyorder.ErrKeyPaused) && !(errors.As(err, &ke) && errors.Is(err, boom)) {
			t.Fatalf("publish behind the failure = %v", err)
		}
	}
	memhook.Of(b).FailSends("t", nil)
	if _, err := p.Publish(ctx, &keyorder.Message{Key: "bad", Payload: []byte("2")}); !errors.Is(err, keyorder.ErrKeyPaused) {
		t.Fatalf("publish after the failure = %v, want ErrKeyPaused", err)
	}
	if got := receiveAll(t, s); len(got) != 1 || got[0].Key != "good" {
		t.Fatalf("sent %d messages; only the good key's should be", len(got))
	}
	if n := p.ResumeAll(); n != 1 {
		t.Fatalf("ResumeAll = %d", n)
	}
	if _, err := p.Publish(ctx, &keyorder.Message{Key: "bad", Payload: []byte("3")}); err != nil {
		t.Fatal(err)
	}
}

func TestTransientErrorsAreRetried(t *testing.T) {
	b, p, s := setup(t, &publish.Config{Backoff: policy.Retry{MinBackoff: 1, MaxBackoff: 1}})
	var calls atomic.Int32
	memhook.Of(b).FailSends("t", func(ms []*driver.Message) error {
		if calls.Add(1) <= 2 {
			return fmt.Errorf("flaky: %w", memhook.ErrTransient)
		}
		return nil
	})
	if _, err := p.Publish(context.Background(), &keyorder.Message{Key: "k", Payload: []byte("x")}); err != nil {
		t.Fatalf("Publish after two transient failures = %v", err)
	}
	if got := receiveAll(t, s); len(got) != 1 {
		t.Fatalf("delivered %d copies", len(got))
	}
	memhook.Of(b).FailSends("t", func(ms []*driver.Message) error { return fmt.Errorf("still flaky: %w", memhook.ErrTransient) })
	_, err := p.Publish(context.Background(), &keyorder.Message{Key: "k2", Payload: []byte("x")})
	var ke *keyorder.Error
	if !errors.As(err, &ke) || ke.Code != keyorder.CodeUnavailable || ke.Op != "publish" {
		t.Fatalf("exhausted retries = %v, want *keyorder.Error with CodeUnavailable", err)
	}
}

func TestConfigAndOpenErrors(t *testing.T) {
	b := memory.NewBroker()
	if _, err := publish.New(memhook.Of(b).TopicDriver("t"), &publish.Config{MaxBatch: -1}); !errors.Is(err, keyorder.ErrInvalidConfig) {
		t.Fatalf("MaxBatch -1 = %v", err)
	}
	for _, mk := range []policy.MissingKey{99, -1} {
		_, err := publish.New(memhook.Of(b).TopicDriver("t"), &publish.Config{MissingKey: mk})
		if !errors.Is(err, keyorder.ErrInvalidConfig) || !strings.Contains(err.Error(), "MissingKey") || !strings.Contains(err.Error(), fmt.Sprint(int(mk))) {
			t.Errorf("MissingKey %d = %v, want ErrInvalidConfig naming the field and value", int(mk), err)
		}
	}
	ctx := context.Background()
	if _, err := publish.Open(ctx, "nats://x", nil); !errors.Is(err, keyorder.ErrUnknownScheme) {
		t.Fatalf("unknown scheme = %v", err)
	}
	if _, err := publish.Open(ctx, "mem://t?bogus=1", nil); !errors.Is(err, keyorder.ErrBadURL) {
		t.Fatalf("unknown parameter = %v", err)
	}
	if _, err := publish.Open(ctx, "::", nil); !errors.Is(err, keyorder.ErrBadURL) {
		t.Fatalf("malformed URL = %v", err)
	}
	p, err := publish.Open(ctx, "mem://t?maxkey=4", nil)
	if err != nil {
		t.Fatal(err)
	}
	var le *keyorder.LimitError
	if _, err := p.Publish(ctx, &keyorder.Message{Key: "12345"}); !errors.As(err, &le) || le.Max != 4 || le.Got != 5 {
		t.Fatalf("key over maxkey = %v", err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(ctx); !errors.Is(err, keyorder.ErrClosed) {
		t.Fatalf("second Close = %v", err)
	}
}
