package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyorder/keyorder/adapters/kafka"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// kafkaPartitions is the partition count of every benchmark topic.
const kafkaPartitions = 8

// freshMetadata lets the producers reload a new topic's metadata soon
// after their first load: a produce that finds a just-created partition
// not ready waits for the next load, by default at least 5s
// (MetadataMinAge) after the last; rounds stalled 5s on it.
var freshMetadata = kgo.MetadataMinAge(100 * time.Millisecond)

func kafkaBackend(context.Context) (*backend, error) {
	list, err := env("KEYORDER_KAFKA_BROKERS", "kafka")
	if err != nil {
		return nil, err
	}
	seeds := kgo.SeedBrokers(strings.Split(list, ",")...)
	admin, err := kgo.NewClient(seeds)
	if err != nil {
		return nil, err
	}
	// create makes the topic and waits until the broker leads every
	// partition, so the publish phase does not time the topic's creation:
	// Metadata names a leader before a KRaft broker leads a new partition,
	// and until it does, Produce and ListOffsets fail with
	// NOT_LEADER_OR_FOLLOWER and franz-go retries after its backoff (a
	// produce) or one second (a group member's start offset). A partition
	// that answers ListOffsets is led.
	create := func(ctx context.Context, id string) error {
		adm := kadm.NewClient(admin)
		r, err := adm.CreateTopic(ctx, kafkaPartitions, 1, nil, id)
		if err == nil {
			err = r.Err
		}
		if err != nil {
			return err
		}
		for {
			ends, err := adm.ListEndOffsets(ctx, id)
			if err == nil {
				err = ends.Error()
			}
			if err == nil && len(ends[id]) == kafkaPartitions {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("topic %s: partitions not led: %w (last: %v)", id, ctx.Err(), err)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	drop := func(id string) {
		_, _ = kadm.NewClient(admin).DeleteTopics(context.Background(), id, kafka.DeadLetterTopic(id, "bench-"+id))
	}
	// Each endpoint gets its own producer: a client shared across topics
	// waits up to its MetadataMinAge (5s) before it loads a new topic's
	// metadata after the last load. keyorder's producer does not linger:
	// the publisher already batches per key (one batch in flight, what
	// queues behind it goes next), and franz-go's 10ms default linger
	// would add 10ms to every key's round.
	f := func(ctx context.Context, id string) (*koDriver, error) {
		if err := create(ctx, id); err != nil {
			return nil, err
		}
		koProducer, err := kgo.NewClient(seeds, kgo.ProducerLinger(0), freshMetadata)
		if err != nil {
			return nil, err
		}
		sopts := &kafka.SubscriptionOptions{Ordering: policy.Ordered, ClientOptions: []kgo.Opt{seeds}, Logger: quiet()}
		return &koDriver{
			openPub: func(ctx context.Context, cfg *publish.Config) (*publish.Publisher, error) {
				return kafka.OpenTopic(ctx, koProducer, id, nil, cfg)
			},
			openSub: func(ctx context.Context, cfg *subscribe.Config) (*subscribe.Subscriber, error) {
				return kafka.OpenSubscription(ctx, id, "bench-"+id, sopts, cfg)
			},
			cleanup: func() { koProducer.Close(); drop(id) },
		}, nil
	}
	t := koTuning{
		subscribe:  subscribe.Config{Workers: 64, MaxOutstanding: 2000},
		publish:    publish.Config{MaxBatch: 1000},
		publishers: 4, chunk: 1000,
	}
	return &backend{
		name:  "kafka",
		title: "Kafka (KRaft broker)",
		note: fmt.Sprintf("Topics of %d partitions. Raw: franz-go, Produce of every record then Flush (idempotent producer, 10ms linger), "+
			"one group member polling and handling each record in its poll loop, autocommit. "+
			"keyorder: a producer without linger; Ordered, %s over the same partitions, offsets committed per partition "+
			"with the completed ones above in the commit metadata.", kafkaPartitions, lanesNote(64)),
		systems: append([]system{{name: "raw franz-go", ref: true,
			open: func(ctx context.Context, id string) (endpoint, error) {
				if err := create(ctx, id); err != nil {
					return nil, err
				}
				producer, err := kgo.NewClient(seeds, freshMetadata)
				if err != nil {
					return nil, err
				}
				return &kafkaRaw{seeds: seeds, producer: producer, topic: id, drop: drop}, nil
			}}},
			koSystems(f, t)...),
		close: admin.Close,
	}, nil
}

// kafkaRaw is franz-go on its own: a producer, and one group member that
// handles each record in its poll loop (franz-go's basic consumer).
type kafkaRaw struct {
	seeds    kgo.Opt
	producer *kgo.Client
	topic    string
	drop     func(string)
}

func (e *kafkaRaw) publish(ctx context.Context, w *workload) error {
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	wg.Add(w.n())
	for i := range w.n() {
		r := &kgo.Record{Topic: e.topic, Key: []byte(w.key(i)), Value: w.payloads[i]}
		e.producer.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				failed.CompareAndSwap(nil, &err)
			}
			wg.Done()
		})
	}
	if err := e.producer.Flush(ctx); err != nil {
		return err
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		return *err
	}
	return nil
}

func (e *kafkaRaw) consume(ctx context.Context, chk *orderCheck) error {
	cl, err := kgo.NewClient(e.seeds, kgo.ConsumerGroup("bench-"+e.topic), kgo.ConsumeTopics(e.topic),
		kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil {
			return ferr
		}
		if handlerWork == 0 {
			fs.EachRecord(func(r *kgo.Record) { chk.see(r.Value) })
			continue
		}
		// With handler work: one goroutine per partition of the fetch,
		// each handling its records in order (franz-go's
		// goroutine-per-partition example), the next poll after all.
		var wg sync.WaitGroup
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			wg.Go(func() {
				p.EachRecord(func(r *kgo.Record) {
					time.Sleep(handlerWork)
					chk.see(r.Value)
				})
			})
		})
		wg.Wait()
	}
}

func (e *kafkaRaw) close() {
	e.producer.Close()
	e.drop(e.topic)
}
