package kafka_test

// This file: the public surface as an application meets it through URLs
// and the typed constructors, with input it should refuse.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/kafka"
	"github.com/keyorder/keyorder/integration"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// TestURLMissingTopic: opening a topic that does not exist, without
// create=true, fails with an error matching keyorder.ErrNotFound that
// names the topic and says how to create it, well before the opener's
// 30-second connect bound (which used to end it with "context deadline
// exceeded", and made keyorder stats exit 1 after its --timeout).
func TestURLMissingTopic(t *testing.T) {
	name := uniqueName("missing")
	base := "kafka://" + strings.Join(brokers(t), ",") + "/" + name
	for what, open := range map[string]func(context.Context) error{
		"publish.Open": func(ctx context.Context) error {
			_, err := publish.Open(ctx, base, nil)
			return err
		},
		"subscribe.Open": func(ctx context.Context) error {
			_, err := subscribe.Open(ctx, base+"?group=g", nil)
			return err
		},
		"kafka.OpenSubscription": func(ctx context.Context) error {
			_, err := kafka.OpenSubscription(ctx, name, "g", subOptions(t, integration.Spec{}), nil)
			return err
		},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := open(ctx)
		cancel()
		if !errors.Is(err, keyorder.ErrNotFound) || errors.Is(err, context.DeadlineExceeded) ||
			!strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "create=true") {
			t.Errorf("%s of a missing topic: %v; want ErrNotFound naming %s and create=true", what, err, name)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Nothing created it on the way.
	tds, err := kadm.NewClient(newClient(t)).ListTopics(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if tds.Has(name) {
		t.Errorf("topic %s exists after the failed opens", name)
	}
}
