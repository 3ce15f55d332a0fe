package kafka_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyorder/keyorder/adapters/kafka"
	"github.com/keyorder/keyorder/integration/drivertest"
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
	lines   []string                // debug log, kept for dump
	live    string                  // print lines at once with this prefix
}

// dump logs the kept debug log.
func (l *traceLog) dump() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.lines {
		l.t.Log(s)
	}
}

func (l *traceLog) logf(format string, args ...any) {
	s := fmt.Sprintf("%v ", l.since()) + fmt.Sprintf(format, args...)
	if l.live != "" {
		fmt.Printf("%s %s %s\n", time.Now().Format("15:04:05.000"), l.live, s)
		return
	}
	l.mu.Lock()
	l.lines = append(l.lines, s)
	l.mu.Unlock()
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
	l.logf("kgo %s: %s %v", level, msg, kv)
}

// OnBrokerWrite counts requests by key (1 Fetch, 2 ListOffsets, 9
// OffsetFetch, 11 JoinGroup, 14 SyncGroup).
func (l *traceLog) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, _ error) {
	l.mu.Lock()
	l.writes[key]++
	l.mu.Unlock()
	if l.debug {
		l.logf("wrote request key %d", key)
	}
}

// OnFetchBatchRead records when each partition's first batch was read.
func (l *traceLog) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, p int32, m kgo.FetchBatchMetrics) {
	l.mu.Lock()
	if _, ok := l.batches[p]; !ok {
		l.batches[p] = l.since()
	}
	l.mu.Unlock()
	if l.debug {
		l.logf("fetched batch of partition %d: %d records", p, m.NumRecords)
	}
}

func (l *traceLog) opts() []kgo.Opt { return []kgo.Opt{kgo.WithLogger(l), kgo.WithHooks(l)} }

// TestFreshGroupFirstRecords: a fresh group over a 4-partition topic
// receives every partition's records, whether they were published before
// the member joined or after, and the clients never had to retry: each
// record took one Produce request (createTopic waits until the broker
// leads every partition; before that a Produce fails with
// NOT_LEADER_OR_FOLLOWER and franz-go retries it after its backoff) and
// the member loaded its start offsets with one ListOffsets request
// (franz-go reloads a failed one after a second). Those retries, not the
// partitions, made records of a case reach the process late.
// KEYORDER_KAFKA_ROUNDS sets the rounds, KEYORDER_KAFKA_TRACE=debug keeps
// the clients' debug log (shown for a round whose first records came out
// of Receive more than 50 ms apart).
func TestFreshGroupFirstRecords(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	prod := newTraceLog(t)
	cl := newClient(t, append(prod.opts(), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))...)
	const parts = 4
	rounds := 6
	if n, err := strconv.Atoi(os.Getenv("KEYORDER_KAFKA_ROUNDS")); err == nil {
		rounds = n
	}
	for round := range rounds {
		topicName := createTopic(ctx, t, cl, parts)
		produce := func() {
			t.Helper()
			prod.mu.Lock()
			before := prod.writes[0]
			prod.mu.Unlock()
			for p := range int32(parts) {
				r := &kgo.Record{Topic: topicName, Partition: p, Key: []byte(fmt.Sprint("k", p)), Value: []byte(fmt.Sprint("p", p))}
				if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
			prod.mu.Lock()
			n := prod.writes[0] - before
			prod.mu.Unlock()
			if n != parts {
				t.Errorf("round %d: %d Produce requests for %d records, one a partition: the first produce to a partition was retried", round, n, parts)
			}
		}
		subscribeFirst := round%2 == 1
		if !subscribeFirst {
			produce()
		}
		tr := newTraceLog(t)
		opts := subOptions(t, drivertest.Spec{Ordering: policy.Ordered})
		opts.ClientOptions = append(opts.ClientOptions, tr.opts()...)
		s, err := kafka.OpenSubscriptionDriver(ctx, topicName, uniqueName("g"), opts)
		if err != nil {
			t.Fatal(err)
		}
		if subscribeFirst {
			produce()
		}
		first := map[int32]time.Duration{}
		receives := 0
		for len(first) < parts {
			ms, err := s.Receive(ctx, 100)
			if err != nil {
				t.Fatalf("round %d: received the first records of %v: %v", round, first, err)
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
		lo, hi := time.Hour, time.Duration(0)
		for _, d := range first {
			lo, hi = min(lo, d), max(hi, d)
		}
		if hi-lo > 50*time.Millisecond {
			tr.dump()
		}
		tr.mu.Lock()
		t.Logf("round %d (subscribed first: %v): first record out of Receive per partition %v (%d receives); first batch fetched %v; requests %v",
			round, subscribeFirst, first, receives, tr.batches, tr.writes)
		if n := tr.writes[2]; n != 1 {
			t.Errorf("round %d: %d ListOffsets requests, want 1: a start offset load failed and was retried", round, n)
		}
		tr.mu.Unlock()
	}
}
