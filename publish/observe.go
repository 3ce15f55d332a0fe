package publish

import (
	"context"

	"github.com/keyorder/keyorder"
)

// Observer sees a Publisher's work, for tracing and metrics. Module
// github.com/keyorder/keyorder/otelkeyorder implements it with
// OpenTelemetry; the publish package itself imports no telemetry API.
// Config.Observer nil means no observation, and costs one nil check per
// message.
type Observer interface {
	// Attach is called once by New. The observer may read p's state (for
	// gauges such as Paused) until detach is called, by Close. detach may
	// be nil.
	Attach(p *Publisher) (detach func())
	// StartPublish is called for each valid message before it is queued,
	// with the context of the Publish or PublishBatch call. The message's
	// ID, key and payload are final; the observer may add headers (m.Headers
	// is the publisher's own copy, nil when the message has none: set a new
	// map), for example a trace context, and they travel with the message.
	// The message is validated again afterwards: headers that break the
	// backend's limits fail the publish (every end called with that error)
	// and nothing is sent. end is called once, with nil when the broker has the message or with
	// the error its caller gets; it may be called after Publish returned
	// (a message whose caller's context ended is still sent).
	StartPublish(ctx context.Context, m *keyorder.Message) (end func(err error))
}
