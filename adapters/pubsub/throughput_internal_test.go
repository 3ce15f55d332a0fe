package pubsub

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/option"
	"google.golang.org/grpc"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/testenv"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// polling is the receive path the driver had before it long-polled: unary
// Pull with ReturnImmediately, sleeping 20 to 200ms after an empty answer.
// It is kept here only as the baseline TestConsumeThroughput measures the
// driver against, in the same run on the same server.
type polling struct{ *Subscription }

func (s polling) Receive(ctx context.Context, maxMessages int) ([]*driver.Message, error) {
	if maxMessages <= 0 || maxMessages > s.maxBatch {
		maxMessages = s.maxBatch
	}
	wait := 20 * time.Millisecond
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		sent := time.Now()
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		resp, err := s.client.SubscriptionAdminClient.Pull(pctx, &pubsubpb.PullRequest{
			Subscription: s.name,
			MaxMessages:  int32(maxMessages),
			//lint:ignore SA1019 the old path, measured as a baseline
			ReturnImmediately: true,
		})
		cancel()
		if err != nil {
			return nil, err
		}
		if len(resp.ReceivedMessages) > 0 {
			out := make([]*driver.Message, 0, len(resp.ReceivedMessages))
			for _, rm := range resp.ReceivedMessages {
				out = append(out, s.fromPubSub(rm, sent, sent))
			}
			slices.SortStableFunc(out, func(a, b *driver.Message) int { return a.PublishTime.Compare(b.PublishTime) })
			return out, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// TestConsumeThroughput measures consumption through the portable layer
// (Ordered, 64 workers) on Google's emulator: the driver's long-poll
// receive path against the old polling one, alternating, in one run. Each
// round publishes KEYORDER_PUBSUB_THROUGHPUT messages (e.g. 20000) of 100
// bytes over 200 keys first, then consumes them, checking per-key order.
// KEYORDER_PUBSUB_ROUNDS sets the rounds per path (default 3); medians are
// logged.
func TestConsumeThroughput(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KEYORDER_PUBSUB_THROUGHPUT"))
	if n <= 0 {
		t.Skip("set KEYORDER_PUBSUB_THROUGHPUT=N to measure")
	}
	testenv.Require(t, testenv.PubSub)
	rounds, _ := strconv.Atoi(os.Getenv("KEYORDER_PUBSUB_ROUNDS"))
	rounds = max(rounds, 1)
	if os.Getenv("KEYORDER_PUBSUB_ROUNDS") == "" {
		rounds = 3
	}
	// Wall-clock rates swing with the machine's load; the Pull counts do
	// not, so they are logged too.
	var pulls, pulled, empty, inPull atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		start := time.Now()
		err := invoker(ctx, method, req, reply, cc, opts...)
		if r, ok := reply.(*pubsubpb.PullResponse); ok {
			pulls.Add(1)
			pulled.Add(int64(len(r.GetReceivedMessages())))
			if len(r.GetReceivedMessages()) == 0 {
				empty.Add(1)
			}
			inPull.Add(int64(time.Since(start)))
		}
		return err
	}
	client, err := gpubsub.NewClient(context.Background(), "keyorder-bench",
		option.WithGRPCDialOption(grpc.WithChainUnaryInterceptor(count)))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	rates := map[string][]float64{}
	for r := range rounds {
		for _, path := range []string{"long-poll", "polling"} {
			p0, m0, e0, w0 := pulls.Load(), pulled.Load(), empty.Load(), inPull.Load()
			rate := consumeRound(t, client, n, path == "polling")
			p, m, e, w := pulls.Load()-p0, pulled.Load()-m0, empty.Load()-e0, time.Duration(inPull.Load()-w0)
			t.Logf("round %d %-9s: %.0f msgs/s, %d Pulls (%d empty), %.1f messages per Pull, %v in Pulls (%v each)",
				r+1, path, rate, p, e, float64(m)/float64(max(p, 1)), w.Round(time.Millisecond), (w / time.Duration(max(p, 1))).Round(time.Microsecond))
			rates[path] = append(rates[path], rate)
		}
	}
	med := func(xs []float64) float64 { sort.Float64s(xs); return xs[len(xs)/2] }
	lp, po := med(rates["long-poll"]), med(rates["polling"])
	t.Logf("%d messages × 100 B over 200 keys, Ordered, 64 workers, median of %d: long-poll %.0f msgs/s, polling %.0f msgs/s (%.2f×)",
		n, rounds, lp, po, lp/po)
}

func consumeRound(t *testing.T, client *gpubsub.Client, n int, old bool) float64 {
	t.Helper()
	const keys = 200
	ctx := context.Background()
	id := strconv.FormatInt(time.Now().UnixNano(), 36)
	topicID, subID := "bench-t-"+id, "bench-s-"+id
	opts := &SubscriptionOptions{Ordering: policy.Ordered}
	if err := CreateTopic(ctx, client, topicID); err != nil {
		t.Fatal(err)
	}
	if err := CreateSubscription(ctx, client, topicID, subID, opts); err != nil {
		t.Fatal(err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, s := range []string{subID, subID + "-dead-sub"} {
			client.SubscriptionAdminClient.DeleteSubscription(dctx, &pubsubpb.DeleteSubscriptionRequest{Subscription: subName(client.Project(), s)})
		}
		for _, tp := range []string{topicID, subID + "-dead"} {
			client.TopicAdminClient.DeleteTopic(dctx, &pubsubpb.DeleteTopicRequest{Topic: topicName(client.Project(), tp)})
		}
	}()
	topic, err := openTopic(ctx, client, topicID, nil)
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	p, err := publish.New(topic, &publish.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	pad := make([]byte, 100)
	ms := make([]*keyorder.Message, n)
	for i := range ms {
		b := slices.Clone(pad)
		copy(b, fmt.Sprintf("%d|%d|", i%keys, i/keys))
		ms[i] = &keyorder.Message{Key: fmt.Sprintf("k%03d", i%keys), Payload: b}
	}
	for i := 0; i < n; i += 1000 {
		if _, err := p.PublishBatch(ctx, ms[i:min(i+1000, n)]); err != nil {
			t.Fatal(err)
		}
	}
	p.Close(ctx)
	topic.Close()

	sub, err := openSubscription(ctx, client, subID, opts)
	if err != nil {
		t.Fatal(err)
	}
	var drv driver.Subscription = sub
	if old {
		drv = polling{sub}
	}
	var done atomic.Int64
	var mu sync.Mutex
	last := map[string]int{}
	bad := 0
	s, err := subscribe.New(drv, &subscribe.Config{Workers: 64, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	all := make(chan struct{})
	start := time.Now()
	rctx, cancel := context.WithCancel(ctx)
	go s.Run(rctx, func(ctx context.Context, d *keyorder.Delivery) error {
		var k, seq int
		fmt.Sscanf(string(d.Payload), "%d|%d|", &k, &seq)
		mu.Lock()
		if prev, ok := last[d.Key]; ok && seq != prev+1 || !ok && seq != 0 {
			bad++
		}
		last[d.Key] = seq
		mu.Unlock()
		if done.Add(1) == int64(n) {
			close(all)
		}
		return nil
	})
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
	}
	dur := time.Since(start)
	cancel()
	s.Close(ctx)
	if bad > 0 || done.Load() != int64(n) {
		t.Fatalf("handled %d of %d, %d out of order", done.Load(), n, bad)
	}
	return float64(n) / dur.Seconds()
}

// TestIdleLatency measures publish→handler latency under sparse traffic
// (one message every 250ms, so the consumer is idle in between) on Google's
// emulator: the long-poll path against the old polling one, whose pause
// after empty answers grows to 200ms. It runs when
// KEYORDER_PUBSUB_THROUGHPUT is set; KEYORDER_PUBSUB_ROUNDS rounds of 40
// messages per path.
func TestIdleLatency(t *testing.T) {
	if n, _ := strconv.Atoi(os.Getenv("KEYORDER_PUBSUB_THROUGHPUT")); n <= 0 {
		t.Skip("set KEYORDER_PUBSUB_THROUGHPUT=N to measure")
	}
	testenv.Require(t, testenv.PubSub)
	rounds, _ := strconv.Atoi(os.Getenv("KEYORDER_PUBSUB_ROUNDS"))
	client, err := gpubsub.NewClient(context.Background(), "keyorder-bench")
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	lat := map[string][]time.Duration{}
	for range max(rounds, 1) {
		for _, path := range []string{"long-poll", "polling"} {
			lat[path] = append(lat[path], idleRound(t, client, 40, path == "polling")...)
		}
	}
	for _, path := range []string{"long-poll", "polling"} {
		ls := lat[path]
		slices.Sort(ls)
		stalls := 0 // a message stranded until its ack deadline
		for _, l := range ls {
			if l > 5*time.Second {
				stalls++
			}
		}
		t.Logf("%-9s idle publish→handler latency over %d messages: p50 %v, p90 %v, max %v, %d over 5s", path, len(ls),
			ls[len(ls)/2].Round(time.Millisecond), ls[len(ls)*9/10].Round(time.Millisecond), ls[len(ls)-1].Round(time.Millisecond), stalls)
	}
}

func idleRound(t *testing.T, client *gpubsub.Client, n int, old bool) []time.Duration {
	t.Helper()
	ctx := context.Background()
	id := strconv.FormatInt(time.Now().UnixNano(), 36)
	topicID, subID := "idle-t-"+id, "idle-s-"+id
	opts := &SubscriptionOptions{Ordering: policy.Ordered}
	if err := CreateTopic(ctx, client, topicID); err != nil {
		t.Fatal(err)
	}
	if err := CreateSubscription(ctx, client, topicID, subID, opts); err != nil {
		t.Fatal(err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, s := range []string{subID, subID + "-dead-sub"} {
			client.SubscriptionAdminClient.DeleteSubscription(dctx, &pubsubpb.DeleteSubscriptionRequest{Subscription: subName(client.Project(), s)})
		}
		for _, tp := range []string{topicID, subID + "-dead"} {
			client.TopicAdminClient.DeleteTopic(dctx, &pubsubpb.DeleteTopicRequest{Topic: topicName(client.Project(), tp)})
		}
	}()
	sub, err := openSubscription(ctx, client, subID, opts)
	if err != nil {
		t.Fatal(err)
	}
	var drv driver.Subscription = sub
	if old {
		drv = polling{sub}
	}
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	s, err := subscribe.New(drv, &subscribe.Config{Workers: 4, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan time.Duration, n)
	rctx, cancel := context.WithCancel(ctx)
	go s.Run(rctx, func(ctx context.Context, d *keyorder.Delivery) error {
		sent, _ := strconv.ParseInt(string(d.Payload), 10, 64)
		got <- time.Since(time.Unix(0, sent))
		return nil
	})
	pub := client.Publisher(topicID)
	pub.EnableMessageOrdering = true
	pub.PublishSettings.DelayThreshold = time.Millisecond
	var out []time.Duration
	for i := range n {
		time.Sleep(250 * time.Millisecond)
		if _, err := pub.Publish(ctx, &gpubsub.Message{Data: []byte(strconv.FormatInt(time.Now().UnixNano(), 10)), OrderingKey: fmt.Sprint("k", i%5)}).Get(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case d := <-got:
			out = append(out, d)
		case <-time.After(90 * time.Second):
			t.Fatalf("old=%v: message %d not handled within 90s (three ack deadlines)", old, i)
		}
	}
	pub.Stop()
	cancel()
	s.Close(ctx)
	return out
}
