package kafka_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyorder/keyorder/adapters/kafka"
	"github.com/keyorder/keyorder/integration"
	"github.com/keyorder/keyorder/policy"
)

// traceLog is a kgo.Logger and kgo hooks that record, with the time since
// start, what a client did: its debug log (when KEYORDER_KAFKA_TRACE is
// set), the requests it wrote, and the fetched batches per partition.
type traceLog struct {
	t     testing.TB
	start time.Time
	debug bool

	mu      sync.Mutex
	writes  map[int16]int           // request key -> requests written
	batches map[int32]time.Duration // partition -> first fetched batch
}

func newTraceLog(t testing.TB) *traceLog {
	return &traceLog{t: t, start: time.Now(), debug: os.Getenv("KEYORDER_KAFKA_TRACE") == "debug",
		writes: map[int16]int{}, batches: map[int32]time.Duration{}}
}

func (l *traceLog) since() time.Duration { return time.Since(l.start).Round(time.Millisecond) }

func (l *traceLog) Level() kgo.LogLevel {
	if l.debug {
		return kgo.LogLevelDebug
	}
	return kgo.LogLevelNone
}

func (l *traceLog) Log(level kgo.LogLevel, msg string, kv ...any) {
	l.t.Logf("%v kgo %s: %s %v", l.since(), level, msg, kv)
}

// OnBrokerWrite counts requests by key (1 Fetch, 2 ListOffsets, 9
// OffsetFetch, 11 JoinGroup, 14 SyncGroup).
func (l *traceLog) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, _ error) {
	l.mu.Lock()
	l.writes[key]++
	l.mu.Unlock()
	if l.debug {
		l.t.Logf("%v wrote request key %d", l.since(), key)
	}
}

// OnFetchBatchRead records when each partition's first batch was read.
func (l *traceLog) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, p int32, m kgo.FetchBatchMetrics) {
	l.mu.Lock()
	if _, ok := l.batches[p]; !ok {
		l.batches[p] = l.since()
	}
	l.mu.Unlock()
}

func (l *traceLog) opts() []kgo.Opt { return []kgo.Opt{kgo.WithLogger(l), kgo.WithHooks(l)} }

// TestFreshGroupFirstRecords: on a fresh group over a 4-partition topic
// whose partitions all hold records, each partition's first record comes
// out of Receive promptly, and in the same hand-out as the others.
func TestFreshGroupFirstRecords(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := newClient(t, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	const parts = 4
	for round := range 5 {
		topicName := createTopic(ctx, t, cl, parts)
		published := map[int32]time.Time{}
		for p := range int32(parts) {
			r := &kgo.Record{Topic: topicName, Partition: p, Key: []byte(fmt.Sprint("k", p)), Value: []byte(fmt.Sprint("p", p))}
			if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatal(err)
			}
			published[p] = time.Now()
		}
		tr := newTraceLog(t)
		opts := subOptions(t, integration.Spec{Ordering: policy.Ordered})
		opts.ClientOptions = append(opts.ClientOptions, tr.opts()...)
		s, err := kafka.OpenSubscriptionDriver(ctx, topicName, uniqueName("g"), opts)
		if err != nil {
			t.Fatal(err)
		}
		first := map[int32]time.Duration{}
		receives := 0
		for len(first) < parts {
			ms, err := s.Receive(ctx, 100)
			if err != nil {
				t.Fatal(err)
			}
			receives++
			for _, m := range ms {
				p := kafka.PartitionOf(m)
				if _, ok := first[p]; !ok {
					first[p] = tr.since()
				}
			}
		}
		s.Close()
		tr.mu.Lock()
		t.Logf("round %d: first record out of Receive per partition %v (after %d receives); first batch fetched %v; requests %v",
			round, first, receives, tr.batches, tr.writes)
		tr.mu.Unlock()
	}
}
