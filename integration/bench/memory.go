package main

import (
	"context"
	"sync"

	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// chanConsumers is how many goroutines drain the raw channel, as many as
// keyorder's lanes below.
const chanConsumers = 8

func memoryBackend(context.Context) (*backend, error) {
	broker := memory.NewBroker()
	f := func(_ context.Context, id string) (*koDriver, error) {
		if err := broker.CreateSubscription(id, id, &memory.SubscriptionOptions{Ordering: policy.Ordered, MaxBatch: 1000}); err != nil {
			return nil, err
		}
		return &koDriver{
			openPub: func(_ context.Context, cfg *publish.Config) (*publish.Publisher, error) {
				return broker.OpenTopic(id, cfg)
			},
			openSub: func(_ context.Context, cfg *subscribe.Config) (*subscribe.Subscriber, error) {
				return broker.OpenSubscription(id, cfg)
			},
			cleanup: func() {},
		}, nil
	}
	t := koTuning{
		publish:    publish.Config{MaxBatch: 1000},
		subscribe:  subscribe.Config{Workers: chanConsumers, MaxOutstanding: 1000},
		publishers: 4, chunk: 1000,
	}
	return &backend{
		name:  "memory",
		title: "memory (in process)",
		note: "Raw: a buffered channel, one producer, 8 consumer goroutines. " +
			"keyorder: the memory broker, Ordered, " + lanesNote(8) + ", 1,000 outstanding.",
		systems: append([]system{{name: "raw channel", ref: true, open: openChan}}, koSystems(f, t)...),
		close:   func() {},
	}, nil
}

// chanEndpoint is the baseline: a channel carrying the payloads, with no
// broker, no acknowledgement and no order beyond the channel's own.
type chanEndpoint struct{ ch chan []byte }

func openChan(_ context.Context, _ string) (endpoint, error) {
	return &chanEndpoint{ch: make(chan []byte, 1<<17)}, nil
}

func (e *chanEndpoint) publish(ctx context.Context, w *workload) error {
	for _, p := range w.payloads {
		select {
		case e.ch <- p:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (e *chanEndpoint) consume(ctx context.Context, chk *orderCheck) error {
	var wg sync.WaitGroup
	for range chanConsumers {
		wg.Go(func() {
			for {
				select {
				case p := <-e.ch:
					chk.see(p)
				case <-ctx.Done():
					return
				}
			}
		})
	}
	wg.Wait()
	return nil
}

func (e *chanEndpoint) close() {}
