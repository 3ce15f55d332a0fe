// Command otel shows keyorder's OpenTelemetry instrumentation: it publishes
// three messages on one key and consumes them with a handler that acks the
// first, fails the second once (a retry) and always fails the third (a dead
// letter after two attempts), and prints the spans and the metrics with
// OpenTelemetry's stdout exporters.
//
// The library (package otelkeyorder) depends on the OpenTelemetry API only;
// this program chooses the SDK and the exporters, as an application does.
//
// It runs on the in-memory backend by default; give a topic URL of another
// backend as its argument (or in KEYORDER_URL, as examples/ledger) to run it
// there:
//
//	go run ./otel 'postgres://localhost/db?topic=orders&migrate=true&create=true'
//	PUBSUB_EMULATOR_HOST=localhost:8085 go run ./otel pubsub://demo-project/orders
//	go run ./otel 'sqs://orders.fifo?endpoint=http://localhost:9324&region=us-east-1'
//	go run ./otel pulsar://localhost:6650/public/default/orders
//
// The subscription is the topic URL with subscription=otel-demo-<run> (on
// SQS the queue itself) and ordering=ordered added.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/keyorder/keyorder"
	_ "github.com/keyorder/keyorder/adapters/memory"
	_ "github.com/keyorder/keyorder/adapters/postgres"
	_ "github.com/keyorder/keyorder/adapters/pubsub"
	_ "github.com/keyorder/keyorder/adapters/pulsar"
	_ "github.com/keyorder/keyorder/adapters/sqs"
	"github.com/keyorder/keyorder/otelkeyorder"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

func main() {
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: otel [topic URL] (default: $KEYORDER_URL, else mem://otel.orders)")
	}
	flag.Parse()
	topicURL := os.Getenv("KEYORDER_URL")
	if flag.NArg() > 0 {
		topicURL = flag.Arg(0)
	}
	if err := run(context.Background(), os.Stdout, topicURL); err != nil {
		fmt.Fprintln(os.Stderr, "otel:", err)
		os.Exit(1)
	}
}

// run does the publish→handle→retry→dead letter run on topicURL and writes
// the telemetry to w.
func run(ctx context.Context, w io.Writer, topicURL string) error {
	if topicURL == "" {
		topicURL = "mem://otel.orders"
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	runID := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)

	// The SDK: spans exported as they end, metrics once at shutdown.
	spanExp, err := stdouttrace.New(stdouttrace.WithWriter(w), stdouttrace.WithPrettyPrint())
	if err != nil {
		return err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spanExp))
	metricExp, err := stdoutmetric.New(stdoutmetric.WithWriter(w), stdoutmetric.WithPrettyPrint())
	if err != nil {
		return err
	}
	reader := sdkmetric.NewPeriodicReader(metricExp, sdkmetric.WithInterval(time.Hour))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tel, err := otelkeyorder.New(&otelkeyorder.Config{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		return err
	}

	subURL, err := subscriptionURL(topicURL, "otel-demo-"+runID)
	if err != nil {
		return err
	}
	system, subName := otelkeyorder.FromURL(subURL)
	sub, err := subscribe.Open(ctx, subURL, &subscribe.Config{
		Workers:  2,
		Retry:    policy.Retry{MaxAttempts: 2, MinBackoff: 200 * time.Millisecond, MaxBackoff: 200 * time.Millisecond},
		Observer: tel.Subscriber(system, subName),
	})
	if err != nil {
		return fmt.Errorf("open subscription: %w", err)
	}
	_, topicName := otelkeyorder.FromURL(topicURL)
	pub, err := publish.Open(ctx, topicURL, &publish.Config{Observer: tel.Publisher(system, topicName)})
	if err != nil {
		return err
	}

	resolved := make(chan string, 8)
	runErr := make(chan error, 1)
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	go func() {
		runErr <- sub.Run(runCtx, func(ctx context.Context, d *keyorder.Delivery) error {
			switch string(d.Payload) {
			case "flaky":
				if d.Attempt == 1 {
					return errors.New("stock service timed out")
				}
			case "poison":
				if d.Attempt >= 2 {
					resolved <- "poison"
				}
				return errors.New("cannot parse order")
			}
			resolved <- string(d.Payload)
			return nil
		})
	}()
	for _, body := range []string{"ok", "flaky", "poison"} {
		m := &keyorder.Message{ID: runID + "-" + body, Key: "order-7", Payload: []byte(body)}
		if _, err := pub.Publish(ctx, m); err != nil {
			return fmt.Errorf("publish %s: %w", body, err)
		}
	}
	timeout := time.After(60 * time.Second)
	for range 3 {
		select {
		case <-resolved:
		case <-timeout:
			return errors.New("the three messages were not resolved within 60s")
		}
	}
	// Cancelling Run's context shuts it down gracefully; Run returns nil.
	stopRun()
	err = <-runErr
	// Shutting the meter provider down exports the metrics to w; before
	// Close, so the gauges (which Close unregisters) are read too.
	err = errors.Join(err, tp.Shutdown(ctx), mp.Shutdown(ctx))
	return errors.Join(err, sub.Close(ctx), pub.Close(ctx))
}

// subscriptionURL adds subscription and ordering parameters to a topic URL,
// the convention every keyorder adapter accepts.
func subscriptionURL(topicURL, name string) (string, error) {
	u, err := url.Parse(topicURL)
	if err != nil {
		return "", err
	}
	q := u.Query()
	if u.Scheme == "sqs" {
		// An SQS FIFO queue is its own subscription.
		name = u.Host
	}
	q.Set("subscription", name)
	q.Set("ordering", "ordered")
	u.RawQuery = q.Encode()
	return u.String(), nil
}
