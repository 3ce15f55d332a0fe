package otelkeyorder_test

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/attribute"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/otelkeyorder"
	"github.com/keyorder/keyorder/publish"
)

// refusingTopic is a driver whose every send fails permanently.
type refusingTopic struct{}

var errRefused = errors.New("refused")

func (refusingTopic) SendBatch(context.Context, []*driver.Message) error { return errRefused }
func (refusingTopic) Limits() driver.Limits                              { return driver.Limits{Backend: "test"} }
func (refusingTopic) IsRetryable(error) bool                             { return false }
func (refusingTopic) ErrorCode(error) keyorder.ErrorCode                 { return keyorder.CodeUnknown }
func (refusingTopic) Close() error                                       { return nil }

// TestPublishFailure: a failed publish ends its span with an error, counts
// in keyorder.published with error.type, and its paused key shows in
// keyorder.paused_keys until resumed.
func TestPublishFailure(t *testing.T) {
	k := newKit(t)
	pub, err := publish.New(refusingTopic{}, &publish.Config{Observer: k.tel.Publisher("test", "t")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := pub.Publish(ctx, &keyorder.Message{Key: "k", Payload: []byte("x")}); !errors.Is(err, errRefused) {
		t.Fatalf("publish: %v, want the driver's error", err)
	}
	if _, err := pub.Publish(ctx, &keyorder.Message{Key: "k", Payload: []byte("y")}); !errors.Is(err, keyorder.ErrKeyPaused) {
		t.Fatalf("second publish: %v, want ErrKeyPaused", err)
	}
	if got := k.metric(t, otelkeyorder.MetricPausedKeys, attribute.String("messaging.destination.name", "t")); got != 1 {
		t.Errorf("paused keys = %v, want 1", got)
	}
	if got := k.metric(t, otelkeyorder.MetricPublished, attribute.String("error.type", "*keyorder.Error")); got != 1 {
		t.Errorf("failed publishes (error.type *keyorder.Error) = %v, want 1", got)
	}
	if got := k.metric(t, otelkeyorder.MetricPublished); got != 2 {
		t.Errorf("published (all outcomes) = %v, want 2", got)
	}
	spans := k.spans.Ended()
	if len(spans) != 2 || spans[0].Status().Code.String() != "Error" || spans[1].Status().Code.String() != "Error" {
		t.Errorf("spans %v, want two send spans with status Error", spans)
	}
	pub.Resume("k")
	if got := k.metric(t, otelkeyorder.MetricPausedKeys); got != 0 {
		t.Errorf("paused keys after Resume = %v, want 0", got)
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
}
