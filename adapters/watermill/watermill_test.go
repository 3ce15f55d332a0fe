package watermill_test

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

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/keyorder/keyorder"
	_ "github.com/keyorder/keyorder/adapters/memory" // the mem:// scheme these tests use
	wmk "github.com/keyorder/keyorder/adapters/watermill"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

var topicSeq atomic.Int64

// newTopic returns a topic name no other test uses (the memory broker is
// shared by the process).
func newTopic(t *testing.T) string {
	return fmt.Sprintf("wmtest-%s-%d", t.Name(), topicSeq.Add(1))
}

func newPub(t *testing.T, keys wmk.KeyConfig) *wmk.Publisher {
	t.Helper()
	p, err := wmk.NewPublisher(wmk.PublisherConfig{URL: "mem://{topic}", Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func newSub(t *testing.T, ordering string, cfg *subscribe.Config) *wmk.Subscriber {
	t.Helper()
	s, err := wmk.NewSubscriber(wmk.SubscriberConfig{
		URL:   "mem://{topic}?subscription={topic}.{group}&ordering=" + ordering,
		Group: "g", Subscribe: cfg, CloseTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func msg(uuid, key, payload string) *message.Message {
	m := message.NewMessage(uuid, []byte(payload))
	if key != "" {
		m.Metadata.Set(keyorder.HeaderPartitionKey, key)
	}
	return m
}

// recv reads one message, failing after a generous bound.
func recv(t *testing.T, ch <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case m, ok := <-ch:
		if !ok {
			t.Fatal("channel closed")
		}
		return m
	case <-time.After(30 * time.Second):
		t.Fatal("no message within 30s")
	}
	return nil
}

// none asserts that nothing is deliverable now (inside a synctest bubble,
// after synctest.Wait, this is exact rather than timed).
func none(t *testing.T, ch <-chan *message.Message, why string) {
	t.Helper()
	synctest.Wait()
	select {
	case m := <-ch:
		t.Fatalf("%s: got %s (key %s)", why, m.UUID, m.Metadata.Get(keyorder.HeaderPartitionKey))
	default:
	}
}

func TestTemplateErrors(t *testing.T) {
	for _, tc := range []struct {
		name, url string
		want      error
	}{
		{"empty", "", keyorder.ErrBadURL},
		{"no topic", "mem://fixed", keyorder.ErrBadURL},
		{"unknown placeholder", "mem://{topic}?subscription={grp}", keyorder.ErrBadURL},
		{"stray brace", "mem://{topic}}", keyorder.ErrBadURL},
		{"no scheme", "{topic}", keyorder.ErrBadURL},
		{"bad url", "mem://{topic}%zz", keyorder.ErrBadURL},
		{"unknown scheme", "kafka://{topic}", keyorder.ErrUnknownScheme},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, perr := wmk.NewPublisher(wmk.PublisherConfig{URL: tc.url})
			_, serr := wmk.NewSubscriber(wmk.SubscriberConfig{URL: tc.url, Group: "g"})
			for _, err := range []error{perr, serr} {
				if !errors.Is(err, tc.want) {
					t.Errorf("got %v, want %v", err, tc.want)
				}
			}
		})
	}
	t.Run("publisher with group", func(t *testing.T) {
		_, err := wmk.NewPublisher(wmk.PublisherConfig{URL: "mem://{topic}?subscription={group}"})
		if !errors.Is(err, keyorder.ErrBadURL) {
			t.Errorf("got %v, want ErrBadURL", err)
		}
	})
	t.Run("group missing", func(t *testing.T) {
		_, err := wmk.NewSubscriber(wmk.SubscriberConfig{URL: "mem://{topic}?subscription={group}"})
		if !errors.Is(err, keyorder.ErrInvalidConfig) {
			t.Errorf("got %v, want ErrInvalidConfig", err)
		}
	})
	t.Run("password redacted", func(t *testing.T) {
		_, err := wmk.NewPublisher(wmk.PublisherConfig{URL: "postgres://u:secret@h/db?x={grp}&topic={topic}"})
		if err == nil || strings.Contains(err.Error(), "secret") {
			t.Errorf("got %v, want an error without the password", err)
		}
	})
}

// Keys resolve as publish resolves them (the per-message key, then the key
// function, then the mount site's key); deliveries carry the key in
// partition-key and the keyorder ID as the UUID.
func TestKeysAndIDsRoundTrip(t *testing.T) {
	topic := newTopic(t)
	sub := newSub(t, "ordered", nil)
	if err := sub.SubscribeInitialize(topic); err != nil {
		t.Fatal(err)
	}
	pub := newPub(t, wmk.KeyConfig{
		Key: "fixed",
		KeyFunc: func(m *message.Message) string {
			return m.Metadata.Get("account")
		},
	})
	byMeta := msg("id-meta", "k-meta", "1")
	byMeta.Metadata.Set("account", "k-func-ignored")
	byFunc := msg("id-func", "", "2")
	byFunc.Metadata.Set("account", "k-func")
	byFixed := msg("", "", "3") // no UUID: keyorder assigns the ID
	byFixed.Metadata.Set("other", "kept")
	if err := pub.Publish(topic, byMeta, byFunc, byFixed); err != nil {
		t.Fatal(err)
	}
	if byFixed.UUID == "" {
		t.Fatal("Publish did not report the ID it assigned")
	}
	want := map[string]string{"id-meta": "k-meta", "id-func": "k-func", byFixed.UUID: "fixed"}
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		m := recv(t, ch)
		if got := m.Metadata.Get(keyorder.HeaderPartitionKey); got != want[m.UUID] {
			t.Errorf("message %s: partition-key %q, want %q", m.UUID, got, want[m.UUID])
		}
		if m.UUID == byFixed.UUID && m.Metadata.Get("other") != "kept" {
			t.Errorf("metadata lost: %v", m.Metadata)
		}
		delete(want, m.UUID)
		m.Ack()
	}
	if len(want) != 0 {
		t.Errorf("not delivered: %v", want)
	}
}

// A keyless message under Reject fails Publish with ErrMissingKey, and
// nothing of its batch is sent.
func TestMissingKeyRejectsWholeBatch(t *testing.T) {
	topic := newTopic(t)
	sub := newSub(t, "ordered", nil)
	if err := sub.SubscribeInitialize(topic); err != nil {
		t.Fatal(err)
	}
	pub := newPub(t, wmk.KeyConfig{})
	err := pub.Publish(topic, msg("a1", "A", "x"), msg("n1", "", "x"), msg("b1", "B", "x"))
	if !errors.Is(err, keyorder.ErrMissingKey) {
		t.Fatalf("got %v, want ErrMissingKey", err)
	}
	if err := pub.Publish(topic, msg("after", "A", "x")); err != nil {
		t.Fatal(err)
	}
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	if m := recv(t, ch); m.UUID != "after" {
		t.Fatalf("first delivery %s: part of the rejected batch was sent", m.UUID)
	}
}

// Under Unordered a keyless message goes through without a key.
func TestMissingKeyUnordered(t *testing.T) {
	topic := newTopic(t)
	sub := newSub(t, "ordered", nil)
	if err := sub.SubscribeInitialize(topic); err != nil {
		t.Fatal(err)
	}
	pub := newPub(t, wmk.KeyConfig{MissingKey: policy.Unordered})
	if err := pub.Publish(topic, msg("n1", "", "x")); err != nil {
		t.Fatal(err)
	}
	ch, _ := sub.Subscribe(context.Background(), topic)
	m := recv(t, ch)
	if m.UUID != "n1" || m.Metadata.Get(keyorder.HeaderPartitionKey) != "" {
		t.Fatalf("got %s key %q", m.UUID, m.Metadata.Get(keyorder.HeaderPartitionKey))
	}
	m.Ack()
}

// recorder is a message.Publisher that records what it was given.
type recorder struct {
	mu   sync.Mutex
	keys []string
}

func (r *recorder) Publish(_ string, ms ...*message.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range ms {
		r.keys = append(r.keys, m.UUID+"="+m.Metadata.Get(keyorder.HeaderPartitionKey))
	}
	return nil
}
func (r *recorder) Close() error { return nil }

func TestKeyDecorator(t *testing.T) {
	rec := &recorder{}
	dec := wmk.KeyDecorator(wmk.KeyConfig{Key: "fixed", KeyFunc: func(m *message.Message) string { return m.Metadata.Get("acct") }})
	pub, err := dec(rec)
	if err != nil {
		t.Fatal(err)
	}
	f := msg("f", "", "x")
	f.Metadata.Set("acct", "A")
	if err := pub.Publish("t", msg("m", "M", "x"), f, msg("d", "", "x")); err != nil {
		t.Fatal(err)
	}
	if want := []string{"m=M", "f=A", "d=fixed"}; !slices.Equal(rec.keys, want) {
		t.Errorf("got %v, want %v", rec.keys, want)
	}
	reject, _ := wmk.KeyDecorator(wmk.KeyConfig{})(rec)
	err = reject.Publish("t", msg("ok", "K", "x"), msg("bad", "", "x"))
	if !errors.Is(err, keyorder.ErrMissingKey) {
		t.Fatalf("got %v, want ErrMissingKey", err)
	}
	if len(rec.keys) != 3 {
		t.Errorf("the decorated publisher got part of a rejected call: %v", rec.keys)
	}
}

// Under Ordered: different keys are handed out concurrently; a key's next
// message waits for the ack; a Nack holds only its key, the message is
// retried in place with backoff before the key's next one.
func TestOrderedNackHoldsOnlyItsKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		topic := newTopic(t)
		sub := newSub(t, "ordered", &subscribe.Config{Workers: 4, Retry: policy.Retry{MinBackoff: time.Minute, MaxBackoff: time.Minute, NoJitter: true}})
		if err := sub.SubscribeInitialize(topic); err != nil {
			t.Fatal(err)
		}
		pub := newPub(t, wmk.KeyConfig{})
		if err := pub.Publish(topic, msg("a1", "A", "x"), msg("a2", "A", "x"), msg("b1", "B", "x"), msg("b2", "B", "x")); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ch, err := sub.Subscribe(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		heads := map[string]*message.Message{}
		for range 2 {
			m := recv(t, ch)
			heads[m.UUID] = m
		}
		if heads["a1"] == nil || heads["b1"] == nil {
			t.Fatalf("want a1 and b1 handed out together, got %v", heads)
		}
		none(t, ch, "a key's next message before its head was settled")
		heads["a1"].Nack()
		none(t, ch, "a2 overtook nacked a1")
		heads["b1"].Ack()
		if m := recv(t, ch); m.UUID != "b2" {
			t.Fatalf("got %s, want b2: key B held by A's nack", m.UUID)
		} else {
			m.Ack()
		}
		none(t, ch, "A released before a1's backoff")
		time.Sleep(time.Minute)
		m := recv(t, ch)
		if m.UUID != "a1" {
			t.Fatalf("got %s, want a1 retried in place", m.UUID)
		}
		m.Ack()
		if m := recv(t, ch); m.UUID != "a2" {
			t.Fatalf("got %s, want a2", m.UUID)
		} else {
			m.Ack()
		}
		cancel()
		for range ch {
		}
	})
}

// Under Exclusive a nacked message lets its key's next one run first.
func TestExclusiveNackLetsNextRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		topic := newTopic(t)
		sub := newSub(t, "exclusive", &subscribe.Config{Retry: policy.Retry{MinBackoff: time.Minute, MaxBackoff: time.Minute, NoJitter: true}})
		if err := sub.SubscribeInitialize(topic); err != nil {
			t.Fatal(err)
		}
		pub := newPub(t, wmk.KeyConfig{})
		if err := pub.Publish(topic, msg("a1", "A", "x"), msg("a2", "A", "x")); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ch, _ := sub.Subscribe(ctx, topic)
		m := recv(t, ch)
		if m.UUID != "a1" {
			t.Fatalf("got %s", m.UUID)
		}
		none(t, ch, "two of a key in flight under Exclusive")
		m.Nack()
		if m := recv(t, ch); m.UUID != "a2" {
			t.Fatalf("got %s, want a2 before a1's retry", m.UUID)
		} else {
			m.Ack()
		}
		none(t, ch, "a1 retried before its backoff")
		time.Sleep(time.Minute)
		if m := recv(t, ch); m.UUID != "a1" {
			t.Fatalf("got %s, want a1's retry", m.UUID)
		} else {
			m.Ack()
		}
		cancel()
		for range ch {
		}
	})
}

// After MaxAttempts nacks a message is dead-lettered and its key moves on.
func TestNackDeadLettersAfterMaxAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		topic := newTopic(t)
		sub := newSub(t, "ordered", &subscribe.Config{Retry: policy.Retry{MaxAttempts: 3, MinBackoff: time.Second, MaxBackoff: time.Second}})
		if err := sub.SubscribeInitialize(topic); err != nil {
			t.Fatal(err)
		}
		pub := newPub(t, wmk.KeyConfig{})
		if err := pub.Publish(topic, msg("a1", "A", "x"), msg("a2", "A", "x")); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ch, _ := sub.Subscribe(ctx, topic)
		for i := range 3 {
			m := recv(t, ch)
			if m.UUID != "a1" {
				t.Fatalf("attempt %d: got %s, want a1", i+1, m.UUID)
			}
			m.Nack()
		}
		if m := recv(t, ch); m.UUID != "a2" {
			t.Fatalf("got %s, want a2 after a1 was dead-lettered", m.UUID)
		} else {
			m.Ack()
		}
		cancel()
		for range ch {
		}
	})
}

// The channel closes when the Subscribe context ends, and a message handed
// out and not settled goes back to the broker: the next subscriber gets it.
// The message's context ends with the ack, and with the subscription.
func TestCloseSemantics(t *testing.T) {
	topic := newTopic(t)
	sub := newSub(t, "ordered", nil)
	if err := sub.SubscribeInitialize(topic); err != nil {
		t.Fatal(err)
	}
	pub := newPub(t, wmk.KeyConfig{})
	if err := pub.Publish(topic, msg("a1", "A", "x"), msg("b1", "B", "x")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch, _ := sub.Subscribe(ctx, topic)
	first, second := recv(t, ch), recv(t, ch)
	first.Ack()
	select {
	case <-first.Context().Done():
	case <-time.After(30 * time.Second):
		t.Fatal("message context not done after Ack")
	}
	cancel()
	for range ch {
	}
	select {
	case <-second.Context().Done():
	default:
		t.Fatal("unsettled message's context not done after the channel closed")
	}
	sub2 := newSub(t, "ordered", nil)
	ch2, _ := sub2.Subscribe(context.Background(), topic)
	if m := recv(t, ch2); m.UUID != second.UUID {
		t.Fatalf("got %s, want %s back", m.UUID, second.UUID)
	} else {
		m.Ack()
	}
	if err := sub2.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-ch2; ok {
		t.Fatal("channel open after Close")
	}
	if _, err := sub2.Subscribe(context.Background(), topic); !errors.Is(err, keyorder.ErrClosed) {
		t.Fatalf("Subscribe after Close: %v, want ErrClosed", err)
	}
}
