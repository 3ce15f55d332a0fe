package main

import (
	"context"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/option"
	"google.golang.org/grpc"

	"github.com/keyorder/keyorder/adapters/pubsub"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

const pubsubProject = "kobench"

func pubsubBackend(ctx context.Context) (*backend, error) {
	if _, err := env("PUBSUB_EMULATOR_HOST", "pubsub"); err != nil {
		return nil, err
	}
	// PUBSUB_EMULATOR_HOST is set: the client talks to the emulator
	// without credentials.
	stats := newPubStats()
	client, err := gpubsub.NewClient(ctx, pubsubProject,
		option.WithGRPCDialOption(grpc.WithChainUnaryInterceptor(stats.unary)))
	if err != nil {
		return nil, err
	}
	sopts := &pubsub.SubscriptionOptions{Ordering: policy.Ordered, MaxBatch: 1000, Logger: quiet()}
	f := func(ctx context.Context, id string) (*koDriver, error) {
		if err := pubsub.CreateTopic(ctx, client, id); err != nil {
			return nil, err
		}
		if err := pubsub.CreateSubscription(ctx, client, id, id, sopts); err != nil {
			return nil, err
		}
		return &koDriver{
			openPub: func(ctx context.Context, cfg *publish.Config) (*publish.Publisher, error) {
				return pubsub.OpenTopic(ctx, client, id, &pubsub.TopicOptions{Logger: quiet()}, cfg)
			},
			openSub: func(ctx context.Context, cfg *subscribe.Config) (*subscribe.Subscriber, error) {
				return pubsub.OpenSubscription(ctx, client, id, sopts, cfg)
			},
			cleanup: func() {
				deletePubSub(client, []string{id, id + "-dead-sub"}, []string{id, id + "-dead"})
			},
		}, nil
	}
	t := koTuning{
		subscribe:  subscribe.Config{Workers: 64, MaxOutstanding: 1000},
		publish:    publish.Config{MaxBatch: 1000},
		publishers: 4, chunk: 1000,
	}
	return &backend{
		name:  "pubsub",
		title: "Pub/Sub (Google's emulator)",
		note: "Raw: the Pub/Sub v2 client, a publisher with message ordering (default batching), " +
			"Receive on a subscription with message ordering enabled (default flow control: 1,000 outstanding), acking each. " +
			"keyorder: Ordered, explicit-ack pull, " + lanesNote(64) + ", 1,000 outstanding.",
		systems: append([]system{{name: "raw Pub/Sub client", ref: true,
			open: func(ctx context.Context, id string) (endpoint, error) { return openPubSubRaw(ctx, client, id) }}},
			koSystems(f, t)...),
		close: func() { client.Close() },
		stats: stats.line,
	}, nil
}

func deletePubSub(client *gpubsub.Client, subs, topics []string) {
	ctx := context.Background()
	for _, s := range subs {
		_ = client.SubscriptionAdminClient.DeleteSubscription(ctx, &pubsubpb.DeleteSubscriptionRequest{
			Subscription: "projects/" + pubsubProject + "/subscriptions/" + s})
	}
	for _, t := range topics {
		_ = client.TopicAdminClient.DeleteTopic(ctx, &pubsubpb.DeleteTopicRequest{Topic: "projects/" + pubsubProject + "/topics/" + t})
	}
}

type pubsubRaw struct {
	client     *gpubsub.Client
	topic, sub string
	id         string
}

func openPubSubRaw(ctx context.Context, client *gpubsub.Client, id string) (endpoint, error) {
	e := &pubsubRaw{client: client, id: id,
		topic: "projects/" + pubsubProject + "/topics/" + id,
		sub:   "projects/" + pubsubProject + "/subscriptions/" + id}
	if _, err := client.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: e.topic}); err != nil {
		return nil, err
	}
	if _, err := client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: e.sub, Topic: e.topic, EnableMessageOrdering: true, AckDeadlineSeconds: 60,
	}); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *pubsubRaw) publish(ctx context.Context, w *workload) error {
	p := e.client.Publisher(e.topic)
	p.EnableMessageOrdering = true
	defer p.Stop()
	rs := make([]*gpubsub.PublishResult, w.n())
	for i := range w.n() {
		rs[i] = p.Publish(ctx, &gpubsub.Message{Data: w.payloads[i], OrderingKey: w.key(i)})
	}
	for _, r := range rs {
		if _, err := r.Get(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (e *pubsubRaw) consume(ctx context.Context, chk *orderCheck) error {
	err := e.client.Subscriber(e.sub).Receive(ctx, func(_ context.Context, m *gpubsub.Message) {
		chk.see(m.Data)
		m.Ack()
	})
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func (e *pubsubRaw) close() { deletePubSub(e.client, []string{e.id}, []string{e.id}) }
