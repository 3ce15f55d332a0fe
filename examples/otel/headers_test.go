package main

import (
	"context"
	"errors"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/otelkeyorder"
	"github.com/keyorder/keyorder/publish"
)

// TestSQSHeaderCost shows the documented cost of tracing on SQS: the trace
// context takes one of the 4 header slots the driver leaves, so a traced
// message with 4 headers of its own fails with a limit error and nothing
// is sent, while 3 fit (Publish validates again after the observer adds
// its headers).
func TestSQSHeaderCost(t *testing.T) {
	u := sqsURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tel, err := otelkeyorder.New(&otelkeyorder.Config{TracerProvider: sdktrace.NewTracerProvider()})
	if err != nil {
		t.Fatal(err)
	}
	system, name := otelkeyorder.FromURL(u)
	traced, err := publish.Open(ctx, u, &publish.Config{Observer: tel.Publisher(system, name)})
	if err != nil {
		t.Fatal(err)
	}
	defer traced.Close(ctx)
	plain, err := publish.Open(ctx, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close(ctx)

	four := map[string]string{"a": "1", "b": "2", "c": "3", "d": "4"}
	if _, err := plain.Publish(ctx, &keyorder.Message{Key: "h", Payload: []byte("plain"), Headers: four}); err != nil {
		t.Fatalf("4 headers without tracing: %v", err)
	}
	_, err = traced.Publish(ctx, &keyorder.Message{Key: "h", Payload: []byte("x"), Headers: four})
	var le *keyorder.LimitError
	if !errors.As(err, &le) || !errors.Is(err, keyorder.ErrInvalidMessage) {
		t.Errorf("a traced message with 4 headers of its own: %v, want a *keyorder.LimitError", err)
	}
	if len(traced.Paused()) != 0 {
		t.Errorf("a message refused before sending paused its key: %v", traced.Paused())
	}
	three := map[string]string{"a": "1", "b": "2", "c": "3"}
	if _, err := traced.Publish(ctx, &keyorder.Message{Key: "h", Payload: []byte("y"), Headers: three}); err != nil {
		t.Errorf("a traced message with 3 headers of its own: %v", err)
	}
}
