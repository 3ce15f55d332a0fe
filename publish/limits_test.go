package publish_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
)

// strictTopic is a memory topic that, like a real broker, refuses in
// SendBatch what it cannot store: NUL or invalid UTF-8 in a header (as
// PostgreSQL's jsonb does) and a header named "huge" (a backend rule it
// declares in Limits.Check, like SQS's encoded size).
type strictTopic struct{ driver.Topic }

func (s strictTopic) SendBatch(ctx context.Context, ms []*driver.Message) error {
	for _, m := range ms {
		for k, v := range m.Headers {
			if strings.ContainsRune(v, 0) || k == "huge" {
				return fmt.Errorf("broker: cannot store header %q", k)
			}
		}
	}
	return s.Topic.SendBatch(ctx, ms)
}

func (s strictTopic) Limits() driver.Limits {
	l := s.Topic.Limits()
	l.Check = func(m *keyorder.Message) error {
		if _, ok := m.Headers["huge"]; ok {
			return errors.New("header huge: over the broker's encoded size")
		}
		return nil
	}
	return l
}

// TestKnowableRejectionPausesNothing: a message the broker would refuse for
// a reason knowable before sending fails with a LimitError, nothing is
// sent, and the key's next valid message is sent (the key is not paused).
func TestKnowableRejectionPausesNothing(t *testing.T) {
	b := memory.NewBroker()
	if err := b.CreateSubscription("t", "s", &memory.SubscriptionOptions{Ordering: policy.Parallel, MaxBatch: 100}); err != nil {
		t.Fatal(err)
	}
	p, err := publish.New(strictTopic{memhook.Of(b).TopicDriver("t")}, &publish.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), SendRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	s, err := memhook.Of(b).SubscriptionDriver("s")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i, h := range []map[string]string{{"a": "nul\x00"}, {"a": "\xff"}, {"huge": "x"}, {"keyorder-id": "x"}} {
		_, err := p.Publish(ctx, &keyorder.Message{Key: "k", Payload: []byte("bad"), Headers: h})
		var le *keyorder.LimitError
		if !errors.As(err, &le) || !errors.Is(err, keyorder.ErrInvalidMessage) {
			t.Errorf("bad message %d: %v, want a LimitError", i, err)
		}
		if _, err := p.Publish(ctx, &keyorder.Message{ID: fmt.Sprint("ok", i), Key: "k", Payload: []byte("ok")}); err != nil {
			t.Errorf("next valid message after bad message %d: %v (the key was paused)", i, err)
		}
	}
	if got := p.Paused(); len(got) != 0 {
		t.Errorf("paused keys %v", got)
	}
	var ids []string
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ms, _ := s.Receive(rctx, 100)
	for _, m := range ms {
		ids = append(ids, m.ID)
	}
	if strings.Join(ids, ",") != "ok0,ok1,ok2,ok3" {
		t.Errorf("delivered %v, want only the valid messages", ids)
	}
}
