package publish_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
)

// oneHeaderTopic is a memory topic whose backend allows one header.
type oneHeaderTopic struct{ driver.Topic }

func (o oneHeaderTopic) Limits() driver.Limits {
	l := o.Topic.Limits()
	l.MaxHeaders = 1
	return l
}

// tracer is an Observer that adds a traceparent header to every message
// and records the ends.
type tracer struct {
	mu       sync.Mutex
	attached int
	detached int
	ends     map[string][]error // by message ID
}

func (tr *tracer) Attach(*publish.Publisher) func() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.attached++
	return func() {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		tr.detached++
	}
}

func (tr *tracer) StartPublish(ctx context.Context, m *keyorder.Message) func(error) {
	if m.Headers == nil {
		m.Headers = map[string]string{}
	}
	m.Headers["traceparent"] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	id := m.ID
	return func(err error) {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		tr.ends[id] = append(tr.ends[id], err)
	}
}

// TestObserverHeadersAreValidated: headers added by the observer travel
// with the message, and count against the backend's limits: a message
// they push over a limit fails with a LimitError before anything is sent,
// without pausing its key, and the observation ends with that error.
func TestObserverHeadersAreValidated(t *testing.T) {
	b := memory.NewBroker()
	if err := b.CreateSubscription("t", "s", &memory.SubscriptionOptions{Ordering: policy.Parallel, MaxBatch: 100}); err != nil {
		t.Fatal(err)
	}
	tr := &tracer{ends: map[string][]error{}}
	p, err := publish.New(oneHeaderTopic{memhook.Of(b).TopicDriver("t")}, &publish.Config{Observer: tr, SendRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := memhook.Of(b).SubscriptionDriver("s")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	_, err = p.Publish(ctx, &keyorder.Message{ID: "full", Key: "k", Payload: []byte("x"), Headers: map[string]string{"mine": "1"}})
	var le *keyorder.LimitError
	if !errors.As(err, &le) || le.Limit != "header count" {
		t.Fatalf("publish with the observer's header over the limit: %v, want a header count LimitError", err)
	}
	_, err = p.PublishBatch(ctx, []*keyorder.Message{
		{ID: "b0", Key: "k", Payload: []byte("x")},
		{ID: "b1", Key: "k", Payload: []byte("x"), Headers: map[string]string{"mine": "1"}},
	})
	if !errors.As(err, &le) || !strings.Contains(err.Error(), "message 1") {
		t.Fatalf("batch with message 1 over the limit: %v, want a LimitError naming message 1", err)
	}
	if paused := p.Paused(); len(paused) != 0 {
		t.Errorf("paused %v after messages refused before sending", paused)
	}
	if _, err := p.Publish(ctx, &keyorder.Message{ID: "fits", Key: "k", Payload: []byte("y")}); err != nil {
		t.Fatal(err)
	}
	ms := receiveAll(t, sub)
	if len(ms) != 1 || ms[0].ID != "fits" || !strings.HasPrefix(ms[0].Headers["traceparent"], "00-") {
		t.Fatalf("received %v, want only %q with the observer's traceparent", ms, "fits")
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for id, want := range map[string]bool{"full": true, "b0": true, "b1": true, "fits": false} {
		ends := tr.ends[id]
		if len(ends) != 1 || (ends[0] != nil) != want {
			t.Errorf("message %s: ends %v, want one end (with an error: %v)", id, ends, want)
		}
	}
	if tr.attached != 1 || tr.detached != 1 {
		t.Errorf("attached %d, detached %d; want 1 each", tr.attached, tr.detached)
	}
}
