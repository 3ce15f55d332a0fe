package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	gopulsar "github.com/apache/pulsar-client-go/pulsar"
	pulsarlog "github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/keyorder/keyorder/adapters/pulsar"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// Pulsar settings shared by both sides.
const (
	pulsarQueue = 1000                  // consumers' receiver queue
	pulsarDelay = 10 * time.Millisecond // producers' batching delay (the client's default)
)

func pulsarBackend(context.Context) (*backend, error) {
	url, err := env("KEYORDER_PULSAR_URL", "pulsar")
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	client, err := gopulsar.NewClient(gopulsar.ClientOptions{
		URL: url, OperationTimeout: 30 * time.Second,
		MetricsRegisterer: reg, MetricsCardinality: gopulsar.MetricsCardinalityTopic,
		Logger: pulsarlog.NewLoggerWithSlog(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))),
	})
	if err != nil {
		return nil, err
	}
	factory := func(noRecord bool) koFactory {
		sopts := &pulsar.SubscriptionOptions{Ordering: policy.Ordered, ReceiverQueueSize: pulsarQueue, Logger: quiet(), NoRunRecord: noRecord}
		return pulsarFactory(client, sopts)
	}
	t := koTuning{
		subscribe:  subscribe.Config{Workers: 64, MaxOutstanding: pulsarQueue},
		publish:    publish.Config{MaxBatch: 1000},
		publishers: 4, chunk: 1000,
	}
	systems := append([]system{{name: "raw pulsar-client-go", ref: true,
		open: func(ctx context.Context, id string) (endpoint, error) { return openPulsarRaw(ctx, client, id) }}},
		koSystems(factory(false), t)...)
	if *pulsarNoRunRecord {
		// The same systems without the run record, side by side.
		for _, s := range koSystems(factory(true), t) {
			s.name += " (no run record)"
			systems = append(systems, s)
		}
	}
	return &backend{
		name:  "pulsar",
		title: "Pulsar (standalone broker)",
		note: fmt.Sprintf("Raw: pulsar-client-go, SendAsync with key-based batching (delay %v), one Key_Shared consumer acking each message. "+
			"keyorder: Ordered (Key_Shared), %s; both with a receiver queue of %d.", pulsarDelay, lanesNote(64), pulsarQueue),
		systems: systems,
		close:   client.Close,
		stats:   pulsarStats(reg),
	}, nil
}

// pulsarNoRunRecord adds keyorder's systems without the run record.
var pulsarNoRunRecord = flag.Bool("pulsar-no-run-record", false,
	"pulsar: also run keyorder's systems with SubscriptionOptions.NoRunRecord, side by side")

// pulsarFactory opens keyorder's drivers on a fresh topic per run.
func pulsarFactory(client gopulsar.Client, sopts *pulsar.SubscriptionOptions) koFactory {
	return func(ctx context.Context, id string) (*koDriver, error) {
		topic := "persistent://public/default/" + id
		// The first consumer creates the subscription; it detaches until
		// the consume phase.
		first, err := pulsar.OpenSubscription(ctx, client, topic, "bench", sopts, nil)
		if err != nil {
			return nil, err
		}
		if err := first.Close(ctx); err != nil {
			return nil, err
		}
		return &koDriver{
			openPub: func(ctx context.Context, cfg *publish.Config) (*publish.Publisher, error) {
				return pulsar.OpenTopic(ctx, client, topic, &pulsar.TopicOptions{BatchingMaxPublishDelay: pulsarDelay}, cfg)
			},
			openSub: func(ctx context.Context, cfg *subscribe.Config) (*subscribe.Subscriber, error) {
				return pulsar.OpenSubscription(ctx, client, topic, "bench", sopts, cfg)
			},
			cleanup: func() {},
		}, nil
	}
}

type pulsarRaw struct {
	client gopulsar.Client
	opts   gopulsar.ConsumerOptions
}

func openPulsarRaw(_ context.Context, client gopulsar.Client, id string) (endpoint, error) {
	e := &pulsarRaw{client: client, opts: gopulsar.ConsumerOptions{
		Topic: "persistent://public/default/" + id, SubscriptionName: "bench", Type: gopulsar.KeyShared,
		SubscriptionInitialPosition:    gopulsar.SubscriptionPositionEarliest,
		ReceiverQueueSize:              pulsarQueue,
		EnableBatchIndexAcknowledgment: true,
	}}
	c, err := client.Subscribe(e.opts) // creates the subscription
	if err != nil {
		return nil, err
	}
	c.Close()
	return e, nil
}

func (e *pulsarRaw) publish(ctx context.Context, w *workload) error {
	p, err := e.client.CreateProducer(gopulsar.ProducerOptions{
		Topic: e.opts.Topic, BatcherBuilderType: gopulsar.KeyBasedBatchBuilder,
		BatchingMaxPublishDelay: pulsarDelay,
	})
	if err != nil {
		return err
	}
	defer p.Close()
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	wg.Add(w.n())
	for i := range w.n() {
		k := w.key(i)
		p.SendAsync(ctx, &gopulsar.ProducerMessage{Key: k, OrderingKey: k, Payload: w.payloads[i]},
			func(_ gopulsar.MessageID, _ *gopulsar.ProducerMessage, err error) {
				if err != nil {
					failed.CompareAndSwap(nil, &err)
				}
				wg.Done()
			})
	}
	if err := p.FlushWithCtx(ctx); err != nil {
		return err
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		return *err
	}
	return nil
}

func (e *pulsarRaw) consume(ctx context.Context, chk *orderCheck) error {
	c, err := e.client.Subscribe(e.opts)
	if err != nil {
		return err
	}
	defer c.Close()
	for {
		select {
		case <-ctx.Done():
			return nil
		case cm := <-c.Chan():
			chk.see(cm.Payload())
			c.Ack(cm.Message)
		}
	}
}

func (e *pulsarRaw) close() {}
