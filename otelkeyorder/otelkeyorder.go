// Package otelkeyorder instruments keyorder publishers and subscribers with
// OpenTelemetry traces and metrics.
//
// It implements publish.Observer and subscribe.Observer, the two small hooks
// the core packages expose, so that publish and subscribe import no
// telemetry API and a program that does not observe pays one nil check per
// message. It is a module of its own, so keyorder's root module does not
// require OpenTelemetry. It depends on the OpenTelemetry API only; the program
// chooses the SDK and exporters and passes its providers in Config (nil
// means the global ones, which do nothing until an SDK is installed).
//
// # Traces
//
// Each published message gets a producer span "send DESTINATION"
// (messaging.operation.type=send) that ends when the broker has the message
// or its publish failed. Its context is injected into the message's headers
// by the propagator (W3C traceparent, and tracestate when the trace has
// one), so it travels on every backend as ordinary headers. Each handler
// attempt gets a consumer span "process SUBSCRIPTION"
// (messaging.operation.type=process) linked to the publish span, as the
// messaging semantic conventions recommend for a message processed apart
// from its producer; Config.ParentFromMessage makes it a child instead. The
// handler's context carries the process span, so the handler's own spans
// are its children. The attempt span records keyorder.attempt and
// keyorder.outcome (ack, retry, dead_letter, released, lease_lost).
//
// # Metrics
//
// See the Metric* constants. Every instrument carries messaging.system (the
// backend) and messaging.destination.name (publisher) or
// messaging.consumer.group.name (subscriber).
//
// Held keys and the oldest held message's age are tracked by this package
// from the outcomes it sees: a message is held from its first retry outcome
// until an ack or dead-letter outcome of the same message ID in this
// process. That is exact where retries run in process (Pub/Sub, Pulsar,
// Kafka, and in-process holds); where the broker holds the key (PostgreSQL, SQS) the
// retry may be taken by another consumer, and the entry stays until
// Config.MaxHeld entries push out the oldest or Config.HeldExpiry passes.
//
// # Dashboard and alerts
//
// The module ships a Grafana dashboard (kit/dashboard.json) and Prometheus
// alerting rules (kit/alerts.yml) for these metrics under the names
// OpenTelemetry's Prometheus exporter gives them (keyorder_held_keys,
// keyorder_held_oldest_age_seconds, keyorder_dead_letters_total, ...); the
// repository's docs/observability.md explains each threshold.
package otelkeyorder

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// ScopeName is the instrumentation scope of the tracer and meter.
const ScopeName = "github.com/keyorder/keyorder/otelkeyorder"

// Metric names.
const (
	MetricPublished       = "keyorder.published"         // counter, messages; error.type on failure
	MetricHandled         = "keyorder.handled"           // counter, attempts, by keyorder.outcome
	MetricProcessDuration = "messaging.process.duration" // histogram, seconds, handler duration, by keyorder.outcome
	MetricRetries         = "keyorder.retries"           // counter, attempts ending in retry
	MetricDeadLetters     = "keyorder.dead_letters"      // counter
	MetricHeldKeys        = "keyorder.held_keys"         // gauge: keys waiting on a failed message
	MetricHeldOldestAge   = "keyorder.held.oldest_age"   // gauge, seconds (see package doc)
	MetricPausedKeys      = "keyorder.paused_keys"       // gauge, publisher
	MetricOutstanding     = "keyorder.outstanding"       // gauge: messages received, not finished
)

// Attribute keys specific to keyorder.
const (
	AttrKey     = attribute.Key("keyorder.key")
	AttrAttempt = attribute.Key("keyorder.attempt")
	AttrOutcome = attribute.Key("keyorder.outcome")
)

// Semantic-convention attribute keys used here.
const (
	attrSystem        = attribute.Key("messaging.system")
	attrDestination   = attribute.Key("messaging.destination.name")
	attrOperationType = attribute.Key("messaging.operation.type")
	attrOperationName = attribute.Key("messaging.operation.name")
	attrGroup         = attribute.Key("messaging.consumer.group.name")
	attrMessageID     = attribute.Key("messaging.message.id")
	attrErrorType     = attribute.Key("error.type")
)

// Defaults for Config.
const (
	MaxHeldDefault    = 10000
	HeldExpiryDefault = time.Hour
)

// Config configures the instrumentation. A nil *Config means all defaults.
type Config struct {
	// TracerProvider creates the tracer. Defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider creates the meter. Defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Propagator writes and reads the trace context in message headers.
	// Defaults to propagation.TraceContext{} (W3C traceparent and
	// tracestate); the global propagator is not used by default because a
	// baggage propagator would add headers a backend may not have room for
	// (SQS allows 4).
	Propagator propagation.TextMapPropagator
	// ParentFromMessage makes each process span a child of the publish span
	// carried in the message (instead of a new trace linked to it).
	ParentFromMessage bool
	// MaxHeld bounds the held messages tracked per subscriber. Defaults
	// to MaxHeldDefault.
	MaxHeld int
	// HeldExpiry forgets a held message not seen again for this long.
	// Defaults to HeldExpiryDefault.
	HeldExpiry time.Duration
}

// Telemetry creates observers sharing one tracer and one set of instruments.
type Telemetry struct {
	cfg    Config
	tracer trace.Tracer
	meter  metric.Meter
	prop   propagation.TextMapPropagator
	// tracing and metering are false for OpenTelemetry's no-op providers,
	// whose work this package then skips.
	tracing, metering bool

	published   metric.Int64Counter
	handled     metric.Int64Counter
	duration    metric.Float64Histogram
	retries     metric.Int64Counter
	deadLetters metric.Int64Counter
	heldKeys    metric.Int64ObservableGauge
	heldAge     metric.Float64ObservableGauge
	paused      metric.Int64ObservableGauge
	outstanding metric.Int64ObservableGauge
}

// New returns a Telemetry.
func New(cfg *Config) (*Telemetry, error) {
	t := &Telemetry{}
	if cfg != nil {
		t.cfg = *cfg
	}
	c := &t.cfg
	tp := c.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	mp := c.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	t.prop = cmp.Or[propagation.TextMapPropagator](c.Propagator, propagation.TraceContext{})
	c.MaxHeld = cmp.Or(c.MaxHeld, MaxHeldDefault)
	c.HeldExpiry = cmp.Or(c.HeldExpiry, HeldExpiryDefault)
	t.tracer = tp.Tracer(ScopeName)
	t.meter = mp.Meter(ScopeName)
	_, noTracer := t.tracer.(tracenoop.Tracer)
	_, noMeter := t.meter.(metricnoop.Meter)
	t.tracing, t.metering = !noTracer, !noMeter
	m := t.meter
	var err error
	must := func(e error) {
		if err == nil {
			err = e
		}
	}
	var e error
	t.published, e = m.Int64Counter(MetricPublished, metric.WithUnit("{message}"), metric.WithDescription("Messages published (error.type set when the publish failed)."))
	must(e)
	t.handled, e = m.Int64Counter(MetricHandled, metric.WithUnit("{attempt}"), metric.WithDescription("Handler attempts, by keyorder.outcome."))
	must(e)
	t.duration, e = m.Float64Histogram(MetricProcessDuration, metric.WithUnit("s"), metric.WithDescription("Handler duration per attempt."))
	must(e)
	t.retries, e = m.Int64Counter(MetricRetries, metric.WithUnit("{attempt}"), metric.WithDescription("Attempts that failed and will be retried."))
	must(e)
	t.deadLetters, e = m.Int64Counter(MetricDeadLetters, metric.WithUnit("{message}"), metric.WithDescription("Messages dead-lettered."))
	must(e)
	t.heldKeys, e = m.Int64ObservableGauge(MetricHeldKeys, metric.WithUnit("{key}"), metric.WithDescription("Keys waiting on a failed message (seen by this process)."))
	must(e)
	t.heldAge, e = m.Float64ObservableGauge(MetricHeldOldestAge, metric.WithUnit("s"), metric.WithDescription("Age (since its broker publish time, else its first failure here) of the oldest message a held key waits on."))
	must(e)
	t.paused, e = m.Int64ObservableGauge(MetricPausedKeys, metric.WithUnit("{key}"), metric.WithDescription("Keys paused by a failed publish."))
	must(e)
	t.outstanding, e = m.Int64ObservableGauge(MetricOutstanding, metric.WithUnit("{message}"), metric.WithDescription("Messages received and not finished."))
	must(e)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// System returns the messaging.system value for a URL scheme or a
// backend name (driver.Limits.Backend): the semantic conventions' names
// where they have one (gcp_pubsub, aws_sqs, pulsar), else the backend's.
func System(backend string) string {
	switch backend {
	case "pubsub":
		return "gcp_pubsub"
	case "sqs":
		return "aws_sqs"
	case "mem":
		return "memory"
	case "postgres", "postgresql":
		return "postgresql"
	case "pulsar+ssl":
		return "pulsar"
	}
	return backend
}

// FromURL returns the messaging.system and the destination or subscription
// name for a keyorder URL such as "mem://ledger" or
// "postgres://host/db?topic=t": the subscription parameter, else the topic
// parameter (the group parameter for Kafka), else the URL's path for Pulsar,
// Kafka and NATS (their host is the broker; NATS's path is the stream), else its host and path. The name never holds credentials; pass your own names
// to Publisher and Subscriber when you want others.
func FromURL(urlstr string) (system, name string) {
	u, err := url.Parse(urlstr)
	if err != nil {
		return "", ""
	}
	// A subscription URL names the subscription in its query; PostgreSQL
	// URLs name the topic there too (the host is the database server).
	q := u.Query()
	where := u.Host + u.Path
	if strings.HasPrefix(u.Scheme, "pulsar") || u.Scheme == "kafka" || u.Scheme == "nats" {
		where = u.Path
	}
	name = cmp.Or(q.Get("subscription"), q.Get("group"), q.Get("topic"), strings.TrimPrefix(where, "/"))
	return System(u.Scheme), name
}

// Publisher returns a publish.Observer for a publisher on system (see
// System) sending to destination.
func (t *Telemetry) Publisher(system, destination string) publish.Observer {
	attrs := []attribute.KeyValue{attrSystem.String(system), attrDestination.String(destination)}
	o := &pubObserver{t: t, system: system, dest: destination, attrs: attrs, set: metric.WithAttributeSet(attribute.NewSet(attrs...))}
	o.countOnly = func(err error) { o.count(err) }
	return o
}

// Subscriber returns a subscribe.Observer for a subscriber on system
// consuming subscription.
func (t *Telemetry) Subscriber(system, subscription string) subscribe.Observer {
	attrs := []attribute.KeyValue{attrSystem.String(system), attrGroup.String(subscription)}
	o := &subObserver{t: t, system: system, sub: subscription, attrs: attrs, set: metric.WithAttributeSet(attribute.NewSet(attrs...)),
		held: map[string]heldMsg{}}
	for i := range o.byOutcome {
		kvs := append(attrs[:len(attrs):len(attrs)], AttrOutcome.String(subscribe.Outcome(i).String()))
		o.byOutcome[i] = metric.WithAttributeSet(attribute.NewSet(kvs...))
	}
	return o
}

// outcomes bounds the subscribe.Outcome values.
const outcomes = int(subscribe.OutcomeLeaseLost) + 1

type pubObserver struct {
	t      *Telemetry
	system string
	dest   string
	attrs  []attribute.KeyValue
	set    metric.MeasurementOption
	// countOnly ends a publish when there is no tracing.
	countOnly func(error)
}

// nopEnd ends a publish when there is neither tracing nor metering.
func nopEnd(error) {}

// count records a publish's outcome in MetricPublished.
func (o *pubObserver) count(err error) {
	if !o.t.metering {
		return
	}
	if err != nil {
		o.t.published.Add(context.Background(), 1, metric.WithAttributeSet(attribute.NewSet(append(o.attrs[:len(o.attrs):len(o.attrs)], attrErrorType.String(errorType(err)))...)))
		return
	}
	o.t.published.Add(context.Background(), 1, o.set)
}

func (o *pubObserver) Attach(p *publish.Publisher) func() {
	reg, err := o.t.meter.RegisterCallback(func(_ context.Context, obs metric.Observer) error {
		obs.ObserveInt64(o.t.paused, int64(len(p.Paused())), o.set)
		return nil
	}, o.t.paused)
	if err != nil {
		otel.Handle(err)
		return nil
	}
	return func() { _ = reg.Unregister() }
}

func (o *pubObserver) StartPublish(ctx context.Context, m *keyorder.Message) func(error) {
	if !o.t.tracing {
		if !o.t.metering {
			return nopEnd
		}
		return o.countOnly
	}
	ctx, span := o.t.tracer.Start(ctx, "send "+o.dest,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(o.attrs...),
		trace.WithAttributes(
			attrOperationType.String("send"),
			attrOperationName.String("publish"),
			attrMessageID.String(m.ID),
			AttrKey.String(m.Key),
		))
	if span.SpanContext().IsValid() {
		if m.Headers == nil {
			m.Headers = make(map[string]string, 2)
		}
		o.t.prop.Inject(ctx, propagation.MapCarrier(m.Headers))
	}
	return func(err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
			et := errorType(err)
			span.SetAttributes(attrErrorType.String(et))
		}
		o.count(err)
		span.End()
	}
}

// errorType names an error for error.type: its Go type, as the semantic
// conventions suggest when there is no better low-cardinality name.
func errorType(err error) string {
	return fmt.Sprintf("%T", err)
}

type heldMsg struct {
	key   string
	since time.Time // broker publish time, else first failure seen
	seen  time.Time // last retry outcome seen
}

type subObserver struct {
	t      *Telemetry
	system string
	sub    string
	attrs  []attribute.KeyValue
	set    metric.MeasurementOption

	// byOutcome holds the metric attributes with each keyorder.outcome.
	byOutcome [outcomes]metric.MeasurementOption

	mu   sync.Mutex
	held map[string]heldMsg // by message ID
}

// nopProcessEnd ends an attempt when there is neither tracing nor metering.
func nopProcessEnd(subscribe.Outcome, error) {}

// record records an attempt's outcome in the metrics.
func (o *subObserver) record(d *keyorder.Delivery, out subscribe.Outcome, start, now time.Time) {
	if !o.t.metering {
		return
	}
	bg := context.Background()
	opt := o.set
	if int(out) < outcomes {
		opt = o.byOutcome[out]
	}
	o.t.handled.Add(bg, 1, opt)
	o.t.duration.Record(bg, now.Sub(start).Seconds(), opt)
	switch out {
	case subscribe.OutcomeRetry:
		o.t.retries.Add(bg, 1, o.set)
	case subscribe.OutcomeDeadLetter:
		o.t.deadLetters.Add(bg, 1, o.set)
	}
	o.noteOutcome(d, out, now)
}

func (o *subObserver) Attach(s *subscribe.Subscriber) func() {
	reg, err := o.t.meter.RegisterCallback(func(_ context.Context, obs metric.Observer) error {
		keys, age := o.heldNow(time.Now())
		obs.ObserveInt64(o.t.heldKeys, int64(keys), o.set)
		obs.ObserveFloat64(o.t.heldAge, age.Seconds(), o.set)
		obs.ObserveInt64(o.t.outstanding, int64(s.Outstanding()), o.set)
		return nil
	}, o.t.heldKeys, o.t.heldAge, o.t.outstanding)
	if err != nil {
		otel.Handle(err)
		return nil
	}
	return func() { _ = reg.Unregister() }
}

// heldNow returns the number of held keys and the age of the oldest held
// message, dropping expired entries.
func (o *subObserver) heldNow(now time.Time) (int, time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	keys := map[string]struct{}{}
	var oldest time.Time
	for id, h := range o.held {
		if now.Sub(h.seen) > o.t.cfg.HeldExpiry {
			delete(o.held, id)
			continue
		}
		keys[h.key] = struct{}{}
		if oldest.IsZero() || h.since.Before(oldest) {
			oldest = h.since
		}
	}
	if oldest.IsZero() {
		return len(keys), 0
	}
	return len(keys), now.Sub(oldest)
}

func (o *subObserver) noteOutcome(d *keyorder.Delivery, out subscribe.Outcome, now time.Time) {
	switch out {
	case subscribe.OutcomeRetry:
		if d.Key == "" {
			return
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		h, ok := o.held[d.ID]
		if !ok {
			if len(o.held) >= o.t.cfg.MaxHeld {
				o.evictOldest()
			}
			h = heldMsg{key: d.Key, since: now}
			if !d.PublishTime.IsZero() {
				h.since = d.PublishTime
			}
		}
		h.seen = now
		o.held[d.ID] = h
	case subscribe.OutcomeAck, subscribe.OutcomeDeadLetter:
		o.mu.Lock()
		delete(o.held, d.ID)
		o.mu.Unlock()
	}
}

func (o *subObserver) evictOldest() {
	var oldID string
	var old time.Time
	for id, h := range o.held {
		if oldID == "" || h.seen.Before(old) {
			oldID, old = id, h.seen
		}
	}
	delete(o.held, oldID)
}

func (o *subObserver) StartProcess(ctx context.Context, d *keyorder.Delivery) (context.Context, func(subscribe.Outcome, error)) {
	if !o.t.tracing {
		if !o.t.metering {
			return ctx, nopProcessEnd
		}
		start := time.Now()
		return ctx, func(out subscribe.Outcome, _ error) { o.record(d, out, start, time.Now()) }
	}
	producer := trace.SpanContextFromContext(o.t.prop.Extract(context.Background(), propagation.MapCarrier(d.Headers)))
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(o.attrs...),
		trace.WithAttributes(
			attrOperationType.String("process"),
			attrOperationName.String("process"),
			attrMessageID.String(d.ID),
			AttrKey.String(d.Key),
			AttrAttempt.Int(d.Attempt),
		),
	}
	if producer.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: producer}))
		if o.t.cfg.ParentFromMessage {
			ctx = trace.ContextWithRemoteSpanContext(ctx, producer)
		}
	}
	ctx, span := o.t.tracer.Start(ctx, "process "+o.sub, opts...)
	start := time.Now()
	return ctx, func(out subscribe.Outcome, err error) {
		now := time.Now()
		oa := AttrOutcome.String(out.String())
		span.SetAttributes(oa)
		if err != nil {
			span.RecordError(err)
			if out != subscribe.OutcomeAck {
				span.SetStatus(codes.Error, err.Error())
			}
		}
		span.End()
		o.record(d, out, start, now)
	}
}
