package publish_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/publish"
)

// gatedTopic holds every SendBatch until the test lets it through.
type gatedTopic struct {
	driver.Topic
	entered chan string
	release chan struct{}
}

func (g *gatedTopic) SendBatch(ctx context.Context, ms []*driver.Message) error {
	g.entered <- string(ms[0].Payload)
	select {
	case <-g.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.Topic.SendBatch(ctx, ms)
}

func payloads(ms []*driver.Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, string(m.Payload))
	}
	return out
}

// A publish whose context ends while it is queued behind its key's batch in
// flight returns ctx.Err(), stays queued and is sent in its place: a later
// publish of the key does not overtake it.
func TestCancelledWhileQueuedKeepsItsPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _, s := setup(t, nil)
		g := &gatedTopic{Topic: memhook.Of(b).TopicDriver("t"), entered: make(chan string, 10), release: make(chan struct{})}
		p, err := publish.New(g, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		first := make(chan error, 1)
		go func() { _, err := p.Publish(ctx, &keyorder.Message{Key: "k", Payload: []byte("m1")}); first <- err }()
		<-g.entered
		cctx, cancel := context.WithCancel(ctx)
		second := make(chan error, 1)
		go func() { _, err := p.Publish(cctx, &keyorder.Message{Key: "k", Payload: []byte("m2")}); second <- err }()
		synctest.Wait()
		cancel()
		if err := <-second; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled publish = %v", err)
		}
		third := make(chan error, 1)
		go func() { _, err := p.Publish(ctx, &keyorder.Message{Key: "k", Payload: []byte("m3")}); third <- err }()
		synctest.Wait()
		close(g.release)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		if err := <-third; err != nil {
			t.Fatal(err)
		}
		if got := payloads(receiveAll(t, s)); !slices.Equal(got, []string{"m1", "m2", "m3"}) {
			t.Fatalf("broker got %v, want m1 m2 m3", got)
		}
		p.Close(ctx)
	})
}

// A publish whose context is already done sends nothing.
func TestPublishWithDoneContextSendsNothing(t *testing.T) {
	_, p, s := setup(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Publish(ctx, &keyorder.Message{Key: "k", Payload: []byte("m1")}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Publish with a done context = %v", err)
	}
	if _, err := p.Publish(context.Background(), &keyorder.Message{Key: "k", Payload: []byte("m2")}); err != nil {
		t.Fatal(err)
	}
	if got := payloads(receiveAll(t, s)); !slices.Equal(got, []string{"m2"}) {
		t.Fatalf("broker got %v, want only m2", got)
	}
}

// Close sends what is queued before it returns, in order.
func TestCloseSendsQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, g, s, errs := queueBehindGate(t)
		ctx := context.Background()
		closed := make(chan error, 1)
		go func() { closed <- p.Close(ctx) }()
		synctest.Wait()
		if _, err := p.Publish(ctx, &keyorder.Message{Key: "k", Payload: []byte("late")}); !errors.Is(err, keyorder.ErrClosed) {
			t.Fatalf("publish during Close = %v", err)
		}
		close(g.release)
		if err := <-closed; err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		if got := payloads(receiveAll(t, s)); !slices.Equal(got, []string{"m1", "m2", "m3"}) {
			t.Fatalf("broker got %v", got)
		}
	})
}

// Close whose context ends cancels the sends: every queued publish fails
// with an error saying the publisher was closed, none is left waiting.
func TestCloseDeadlineFailsQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, _, s, errs := queueBehindGate(t)
		ctx := context.Background()
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if err := p.Close(cctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Close = %v", err)
		}
		for range 3 {
			if err := <-errs; !errors.Is(err, keyorder.ErrClosed) {
				t.Fatalf("queued publish after Close's deadline = %v, want ErrClosed", err)
			}
		}
		rctx, cancelReceive := context.WithTimeout(ctx, time.Second)
		defer cancelReceive()
		if got, _ := s.Receive(rctx, 10); len(got) != 0 {
			t.Fatalf("broker got %v", payloads(got))
		}
	})
}

// queueBehindGate returns a publisher (batches of one) whose sends wait at a
// gate, with m1, m2 and m3 of key k published and queued behind it; their
// results arrive on errs.
func queueBehindGate(t *testing.T) (*publish.Publisher, *gatedTopic, memhook.Subscription, chan error) {
	t.Helper()
	b, _, s := setup(t, nil)
	g := &gatedTopic{Topic: memhook.Of(b).TopicDriver("t"), entered: make(chan string, 10), release: make(chan struct{})}
	p, err := publish.New(g, &publish.Config{MaxBatch: 1})
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 3)
	for _, m := range []string{"m1", "m2", "m3"} {
		go func() {
			_, err := p.Publish(context.Background(), &keyorder.Message{Key: "k", Payload: []byte(m)})
			errs <- err
		}()
		synctest.Wait()
	}
	return p, g, s, errs
}

// PublishAsync retains nothing of m: the caller may reuse the payload
// buffer and the headers map once it returned, while the message still
// waits to be sent, and the broker gets what was published.
func TestPublishAsyncDoesNotRetainMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _, s := setup(t, nil)
		g := &gatedTopic{Topic: memhook.Of(b).TopicDriver("t"), entered: make(chan string, 10), release: make(chan struct{})}
		p, err := publish.New(g, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close(context.Background())
		ctx := context.Background()
		first := p.PublishAsync(ctx, &keyorder.Message{Key: "k", Payload: []byte("m1")})
		<-g.entered // m1 in flight: m2 queues behind it
		buf := []byte("m2")
		hs := map[string]string{"h": "v"}
		batch := []*keyorder.Message{{Key: "k", Payload: []byte("m3")}, {Key: "k", Payload: []byte("m4")}}
		second := p.PublishAsync(ctx, &keyorder.Message{Key: "k", Payload: buf, Headers: hs})
		bctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { _, err := p.PublishBatch(bctx, batch); done <- err }()
		synctest.Wait()
		cancel() // PublishBatch returns; its messages stay queued
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("PublishBatch = %v, want context.Canceled", err)
		}
		copy(buf, "XX")
		hs["h"] = "changed"
		copy(batch[0].Payload, "XX")
		copy(batch[1].Payload, "XX")
		close(g.release)
		for _, r := range []*publish.Result{first, second} {
			if _, err := r.Get(ctx); err != nil {
				t.Fatal(err)
			}
		}
		p.Close(ctx)
		got := receiveAll(t, s)
		if ps := payloads(got); !slices.Equal(ps, []string{"m1", "m2", "m3", "m4"}) {
			t.Fatalf("broker got %v, want [m1 m2 m3 m4]: the caller's later bytes were sent", ps)
		}
		if got[1].Headers["h"] != "v" {
			t.Fatalf("broker got header %q, want v", got[1].Headers["h"])
		}
	})
}
