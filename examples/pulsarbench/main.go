// Command pulsarbench compares keyorder on Pulsar with the raw client doing
// the same work without order enforcement, side by side in one run.
//
// Raw: a Key_Shared subscription, a producer with key-based batching sending
// every message with SendAsync, one consumer acknowledging each message as
// it arrives. keyorder: publish.Publisher (PublishBatch of -chunk messages,
// in order) and subscribe.Subscriber under policy.Ordered with keyed lanes.
// Both publish N messages of -size bytes over -keys keys, then consume them;
// publishing and consuming are timed separately (the subscription exists
// before publishing; its consumer attaches only after). Each message carries
// its per-key sequence number, and every consumer counts per-key order
// violations (a message that is not the successor of the last one handled
// for its key; a redelivery of an already handled one counts as a
// duplicate, not a violation).
//
//	go run ./integration/cmd/testenv run --only pulsar -- go run ./examples/pulsarbench
//	go run ./examples/pulsarbench -url pulsar://127.0.0.1:6650 -n 20000 -keys 200 -rounds 3
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	gopulsar "github.com/apache/pulsar-client-go/pulsar"
	pulsarlog "github.com/apache/pulsar-client-go/pulsar/log"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/pulsar"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

var (
	brokerURL  = flag.String("url", os.Getenv("KEYORDER_PULSAR_URL"), "Pulsar service URL")
	nMsgs      = flag.Int("n", 20_000, "messages per run")
	nKeys      = flag.Int("keys", 200, "distinct ordering keys")
	size       = flag.Int("size", 100, "payload bytes")
	rounds     = flag.Int("rounds", 1, "rounds (medians are reported when > 1)")
	workers    = flag.Int("workers", 64, "keyorder lanes")
	queue      = flag.Int("receiverqueue", 1000, "consumer receiver queue size (both)")
	chunk      = flag.Int("chunk", 1000, "messages per keyorder PublishBatch call")
	publishers = flag.Int("publishers", 4, "keyorder publishing goroutines (each owns a share of the keys)")
	delay      = flag.Duration("batchdelay", 10*time.Millisecond, "producers' batching delay (both; the client's default is 10ms, the driver's 1ms)")
	cpuprof    = flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	timeout    = flag.Duration("timeout", 2*time.Minute, "give up a run after this long")
)

// result is one run of one variant.
type result struct {
	publish, consume float64 // msgs/s
	violations, dups int
}

// orderCheck counts per-key order violations.
type orderCheck struct {
	mu         sync.Mutex
	next       map[string]uint64
	handled    atomic.Int64
	violations int
	dups       int
	done       chan struct{}
	n          int64
}

func newOrderCheck(n int) *orderCheck {
	return &orderCheck{next: map[string]uint64{}, done: make(chan struct{}), n: int64(n)}
}

func (o *orderCheck) see(key string, payload []byte) {
	seq := binary.BigEndian.Uint64(payload)
	o.mu.Lock()
	want := o.next[key]
	switch {
	case seq == want:
		o.next[key] = seq + 1
	case seq < want:
		o.dups++
		o.mu.Unlock()
		return
	default:
		o.violations++
		o.next[key] = seq + 1
	}
	o.mu.Unlock()
	if o.handled.Add(1) == o.n {
		close(o.done)
	}
}

// messages returns the run's messages in publish order: round-robin over
// the keys, each payload starting with its per-key sequence number.
func messages() (keys []string, payloads [][]byte) {
	seqs := make([]uint64, *nKeys)
	for i := range *nMsgs {
		k := i % *nKeys
		p := make([]byte, max(*size, 8))
		binary.BigEndian.PutUint64(p, seqs[k])
		seqs[k]++
		keys = append(keys, "key-"+strconv.Itoa(k))
		payloads = append(payloads, p)
	}
	return keys, payloads
}

func newClient() gopulsar.Client {
	c, err := gopulsar.NewClient(gopulsar.ClientOptions{
		URL: *brokerURL, OperationTimeout: 30 * time.Second,
		Logger: pulsarlog.NewLoggerWithSlog(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))),
	})
	if err != nil {
		die(err)
	}
	return c
}

func topicName(variant string, round int) string {
	return fmt.Sprintf("persistent://public/default/bench-%s-%d-%d", variant, time.Now().UnixNano(), round)
}

func raw(round int) result {
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	client := newClient()
	defer client.Close()
	topic := topicName("raw", round)
	opts := gopulsar.ConsumerOptions{
		Topic: topic, SubscriptionName: "bench", Type: gopulsar.KeyShared,
		SubscriptionInitialPosition:    gopulsar.SubscriptionPositionEarliest,
		ReceiverQueueSize:              *queue,
		EnableBatchIndexAcknowledgment: true,
	}
	c, err := client.Subscribe(opts) // creates the subscription
	if err != nil {
		die(err)
	}
	c.Close()
	p, err := client.CreateProducer(gopulsar.ProducerOptions{
		Topic: topic, BatcherBuilderType: gopulsar.KeyBasedBatchBuilder,
		BatchingMaxPublishDelay: *delay,
	})
	if err != nil {
		die(err)
	}
	keys, payloads := messages()
	var res result
	var failed atomic.Int64
	var wg sync.WaitGroup
	wg.Add(len(keys))
	began := time.Now()
	for i := range keys {
		p.SendAsync(ctx, &gopulsar.ProducerMessage{Key: keys[i], OrderingKey: keys[i], Payload: payloads[i]},
			func(_ gopulsar.MessageID, _ *gopulsar.ProducerMessage, err error) {
				if err != nil {
					failed.Add(1)
				}
				wg.Done()
			})
	}
	p.FlushWithCtx(ctx)
	wg.Wait()
	res.publish = float64(len(keys)) / time.Since(began).Seconds()
	p.Close()
	if failed.Load() > 0 {
		die("raw: %d sends failed", failed.Load())
	}

	check := newOrderCheck(len(keys))
	began = time.Now()
	c, err = client.Subscribe(opts)
	if err != nil {
		die(err)
	}
	defer c.Close()
	go func() {
		for {
			select {
			case <-check.done:
				return
			case cm := <-c.Chan():
				check.see(cm.Key(), cm.Payload())
				c.Ack(cm.Message)
			}
		}
	}()
	select {
	case <-check.done:
	case <-ctx.Done():
		die("raw: consumed %d of %d before the timeout", check.handled.Load(), len(keys))
	}
	res.consume = float64(len(keys)) / time.Since(began).Seconds()
	res.violations, res.dups = check.violations, check.dups
	return res
}

func ordered(round int) result {
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	client := newClient()
	defer client.Close()
	name := topicName("keyorder", round)
	sopts := &pulsar.SubscriptionOptions{Ordering: policy.Ordered, ReceiverQueueSize: *queue}
	drv, err := pulsar.OpenSubscription(ctx, client, name, "bench", sopts) // creates the subscription
	if err != nil {
		die(err)
	}
	drv.Close()
	topic, err := pulsar.OpenTopic(ctx, client, name, &pulsar.TopicOptions{BatchingMaxPublishDelay: *delay})
	if err != nil {
		die(err)
	}
	pub, err := publish.New(topic, nil)
	if err != nil {
		die(err)
	}
	keys, payloads := messages()
	ms := make([]*keyorder.Message, len(keys))
	for i := range keys {
		ms[i] = &keyorder.Message{Key: keys[i], Payload: payloads[i]}
	}
	var res result
	// -publishers goroutines, each owning a share of the keys and
	// publishing its messages in order, -chunk at a time.
	shares := make([][]*keyorder.Message, *publishers)
	for i, m := range ms {
		shares[(i%*nKeys)%*publishers] = append(shares[(i%*nKeys)%*publishers], m)
	}
	began := time.Now()
	var wg sync.WaitGroup
	for _, share := range shares {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range slices.Chunk(share, *chunk) {
				if _, err := pub.PublishBatch(ctx, c); err != nil {
					die(err)
				}
			}
		}()
	}
	wg.Wait()
	res.publish = float64(len(keys)) / time.Since(began).Seconds()
	pub.Close(ctx)

	check := newOrderCheck(len(keys))
	began = time.Now()
	drv, err = pulsar.OpenSubscription(ctx, client, name, "bench", sopts)
	if err != nil {
		die(err)
	}
	sub, err := subscribe.New(drv, &subscribe.Config{Workers: *workers, MaxOutstanding: *queue})
	if err != nil {
		die(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- sub.Run(rctx, func(ctx context.Context, d *keyorder.Delivery) error {
			check.see(d.Key, d.Payload)
			return nil
		})
	}()
	select {
	case <-check.done:
	case <-ctx.Done():
		die("keyorder: consumed %d of %d before the timeout", check.handled.Load(), len(keys))
	}
	res.consume = float64(len(keys)) / time.Since(began).Seconds()
	stop()
	<-done
	drv.Close()
	res.violations, res.dups = check.violations, check.dups
	return res
}

func median(rs []result, f func(result) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	return v[len(v)/2]
}

func main() {
	flag.Parse()
	if *brokerURL == "" {
		die("no broker: set -url or KEYORDER_PULSAR_URL")
	}
	if *cpuprof != "" {
		f, err := os.Create(*cpuprof)
		if err != nil {
			die(err)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	var raws, kos []result
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "round\tvariant\tpublish msgs/s\tconsume msgs/s\torder violations\tduplicates\n")
	for r := range *rounds {
		variants := []struct {
			name string
			run  func(int) result
			into *[]result
		}{{"raw", raw, &raws}, {"keyorder", ordered, &kos}}
		if r%2 == 1 {
			// Alternate which goes first: the broker warms up over a run.
			slices.Reverse(variants)
		}
		for _, v := range variants {
			res := v.run(r)
			*v.into = append(*v.into, res)
			fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.0f\t%d\t%d\n", r+1, v.name, res.publish, res.consume, res.violations, res.dups)
		}
	}
	pub := func(r result) float64 { return r.publish }
	con := func(r result) float64 { return r.consume }
	fmt.Fprintf(tw, "median\traw\t%.0f\t%.0f\t\t\n", median(raws, pub), median(raws, con))
	fmt.Fprintf(tw, "median\tkeyorder\t%.0f\t%.0f\t\t\n", median(kos, pub), median(kos, con))
	fmt.Fprintf(tw, "ratio\tkeyorder/raw\t%.2f\t%.2f\t\t\n", median(kos, pub)/median(raws, pub), median(kos, con)/median(raws, con))
	tw.Flush()
	fmt.Printf("%d messages of %d B over %d keys, key-based batching (delay %v); keyorder: Ordered, %d lanes, receiver queue %d\n",
		*nMsgs, *size, *nKeys, *delay, *workers, *queue)
}

// die reports err and exits (the log package's output goes through slog,
// which this program silences below errors).
func die(format any, args ...any) {
	if f, ok := format.(string); ok && len(args) > 0 {
		fmt.Fprintf(os.Stderr, "pulsarbench: "+f+"\n", args...)
	} else {
		fmt.Fprintln(os.Stderr, "pulsarbench:", format)
	}
	os.Exit(1)
}
