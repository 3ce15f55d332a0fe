package pulsar_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	gopulsar "github.com/apache/pulsar-client-go/pulsar"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/pulsar"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/testenv"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// waitFor polls cond every 20ms until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// seen records payloads in handling order, safe for concurrent use.
type seen struct {
	mu sync.Mutex
	s  []string
}

func (r *seen) add(v string) {
	r.mu.Lock()
	r.s = append(r.s, v)
	r.mu.Unlock()
}

func (r *seen) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.s)
}

// runSubscriber runs a subscriber on drv until the test ends.
func runSubscriber(t *testing.T, drv driver.Subscription, cfg *subscribe.Config, h subscribe.HandlerFunc) *subscribe.Subscriber {
	t.Helper()
	sub, err := subscribe.New(drv, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := sub.Run(ctx, h); err != nil {
			t.Errorf("subscriber: %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		drv.Close()
	})
	return sub
}

// TestProveWhyKeyorderRetriesBeforeSuccessors fails message 0 of a key once:
// through keyorder the handler sees 0, 0, 1, 2, 3, 4 (the retry before the
// key's later messages), where the raw client's nack reorders (below).
func TestProveWhyKeyorderRetriesBeforeSuccessors(t *testing.T) {
	client := newClient(t)
	ctx := context.Background()
	topicName := uniqueTopic("why")
	drv, err := pulsar.OpenSubscriptionDriver(ctx, client, topicName, "s", &pulsar.SubscriptionOptions{Ordering: policy.Ordered})
	if err != nil {
		t.Fatal(err)
	}
	var got seen
	var once sync.Once
	runSubscriber(t, drv, &subscribe.Config{Workers: 4, Retry: policy.Retry{MinBackoff: 50 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}},
		func(ctx context.Context, d *keyorder.Delivery) error {
			got.add(string(d.Payload))
			if string(d.Payload) == "0" {
				var err error
				once.Do(func() { err = errors.New("insufficient funds, try again") })
				return err
			}
			return nil
		})
	topic, err := pulsar.OpenTopicDriver(ctx, client, topicName, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := publish.New(topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(ctx)
	for i := range 5 {
		if _, err := pub.Publish(ctx, &keyorder.Message{Key: "acct-42", Payload: []byte(strconv.Itoa(i))}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 30*time.Second, "six deliveries", func() bool { return len(got.get()) >= 6 })
	if want := []string{"0", "0", "1", "2", "3", "4"}; !slices.Equal(got.get(), want) {
		t.Fatalf("keyorder handled %v, want %v", got.get(), want)
	}
}

// TestProveWhyRawNackReorders is the same scenario on the raw client with a
// plain Nack: Pulsar redelivers message 0 after its key's successors. This
// documents the broker (Pulsar 4.0.7): if it starts holding the key, this
// test says so.
func TestProveWhyRawNackReorders(t *testing.T) {
	for _, batching := range []bool{false, true} {
		t.Run(fmt.Sprintf("batching=%v", batching), func(t *testing.T) {
			client := newClient(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			topicName := uniqueTopic("raw")
			c, err := client.Subscribe(gopulsar.ConsumerOptions{
				Topic: topicName, SubscriptionName: "s", Type: gopulsar.KeyShared,
				SubscriptionInitialPosition:    gopulsar.SubscriptionPositionEarliest,
				NackRedeliveryDelay:            100 * time.Millisecond,
				EnableBatchIndexAcknowledgment: true,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			p, err := client.CreateProducer(gopulsar.ProducerOptions{Topic: topicName, DisableBatching: !batching,
				BatcherBuilderType: gopulsar.KeyBasedBatchBuilder, BatchingMaxPublishDelay: 10 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			for i := range 5 {
				p.SendAsync(ctx, &gopulsar.ProducerMessage{Key: "acct-42", OrderingKey: "acct-42", Payload: []byte(strconv.Itoa(i))}, nil)
			}
			if err := p.FlushWithCtx(ctx); err != nil {
				t.Fatal(err)
			}
			var got []string
			nacked := false
			for len(got) < 6 {
				m, err := c.Receive(ctx)
				if err != nil {
					t.Fatalf("after %v: %v", got, err)
				}
				got = append(got, string(m.Payload()))
				if string(m.Payload()) == "0" && !nacked {
					nacked = true
					c.Nack(m)
					continue
				}
				c.Ack(m)
			}
			if want := []string{"0", "1", "2", "3", "4", "0"}; !slices.Equal(got, want) {
				t.Fatalf("raw client with Nack saw %v, want the broker's reorder %v", got, want)
			}
		})
	}
}

func TestDefaultBatcherNeverUsed(t *testing.T) {
	client := newClient(t)
	ctx := context.Background()
	topicName := uniqueTopic("batcher")
	for _, opts := range []*pulsar.TopicOptions{
		{ProducerOptions: &gopulsar.ProducerOptions{}},
		{ProducerOptions: &gopulsar.ProducerOptions{BatcherBuilderType: gopulsar.DefaultBatchBuilder, BatchingMaxMessages: 100}},
	} {
		if _, err := pulsar.OpenTopicDriver(ctx, client, topicName, opts); !errors.Is(err, pulsar.ErrDefaultBatcher) || !errors.Is(err, keyorder.ErrInvalidConfig) {
			t.Errorf("OpenTopic(%+v) = %v, want ErrDefaultBatcher", opts.ProducerOptions, err)
		}
	}
	for _, opts := range []*pulsar.TopicOptions{
		nil,
		{DisableBatching: true, ProducerOptions: &gopulsar.ProducerOptions{}},
		{ProducerOptions: &gopulsar.ProducerOptions{DisableBatching: true}},
		{ProducerOptions: &gopulsar.ProducerOptions{BatcherBuilderType: gopulsar.KeyBasedBatchBuilder}},
	} {
		tp, err := pulsar.OpenTopicDriver(ctx, client, topicName, opts)
		if err != nil {
			t.Errorf("OpenTopic(%+v) = %v", opts, err)
			continue
		}
		tp.Close()
	}
	if _, err := driver.DefaultMux().OpenTopic(ctx, brokerURL(t, "/public/default/x?batching=default")); !errors.Is(err, keyorder.ErrBadURL) {
		t.Errorf("batching=default: %v, want ErrBadURL", err)
	}
}

// brokerURL returns the test broker's URL with path and query appended.
func brokerURL(t *testing.T, rest string) string {
	return testenv.Require(t, testenv.Pulsar) + rest
}

func TestBadURLParameters(t *testing.T) {
	ctx := context.Background()
	for _, u := range []string{
		"pulsar://h:6650/public/default/t?subscription=s&colour=blue",
		"pulsar://h:6650/public/default/t?subscription=s&ordering=fifo",
		"pulsar://h:6650/public/default/t?subscription=s&sticky=5",
		"pulsar://h:6650/public/default/t?subscription=s&receiverqueue=0",
		"pulsar://h:6650/public/default/t?subscription=s&lease=soon",
		"pulsar://h:6650/public/default/t?subscription=s&batching=default",
		"pulsar://h:6650/public/default/t?subscription=s&tlsallowinsecure=maybe",
		"pulsar://h:6650/public/default/t?subscription=s&tlscertfile=/c",
		"pulsar://h:6650/public/default/t?ordering=ordered",
		"pulsar://h:6650/public/default?subscription=s",
		"pulsar:///public/default/t?subscription=s",
	} {
		if _, err := driver.DefaultMux().OpenSubscription(ctx, u); !errors.Is(err, keyorder.ErrBadURL) {
			t.Errorf("OpenSubscription(%s) = %v, want ErrBadURL", u, err)
		}
	}
	for _, u := range []string{
		"pulsar://h:6650/public/default/t?subscription=s",
		"pulsar://h:6650/public/default/t?colour=blue",
		"pulsar://h:6650/t",
	} {
		if _, err := driver.DefaultMux().OpenTopic(ctx, u); !errors.Is(err, keyorder.ErrBadURL) {
			t.Errorf("OpenTopic(%s) = %v, want ErrBadURL", u, err)
		}
	}
	// Secrets never reach the error.
	_, err := driver.DefaultMux().OpenSubscription(ctx, "pulsar://user:hunter2@h:6650/public/default/t?subscription=s&token=SECRETJWT&colour=blue")
	if err == nil || strings.Contains(err.Error(), "SECRETJWT") || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error leaks a secret: %v", err)
	}
}

// emptyTopic asserts nothing was ever published on topicName.
func emptyTopic(t *testing.T, client gopulsar.Client, topicName string) {
	t.Helper()
	r, err := client.CreateReader(gopulsar.ReaderOptions{Topic: topicName, StartMessageID: gopulsar.EarliestMessageID()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.HasNext() {
		m, _ := r.Next(context.Background())
		t.Fatalf("topic %s holds a message (%q): something was sent", topicName, m.Payload())
	}
}

func TestBadInputNothingSent(t *testing.T) {
	client := newClient(t)
	ctx := context.Background()
	topicName := uniqueTopic("bad")
	topic, err := pulsar.OpenTopicDriver(ctx, client, topicName, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := publish.New(topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(ctx)
	lim := topic.Limits()
	if lim.MaxPayloadBytes != pulsar.MaxMessageBytesDefault-pulsar.MetadataRoom {
		t.Fatalf("payload limit %d", lim.MaxPayloadBytes)
	}
	for name, m := range map[string]*keyorder.Message{
		"key too long":    {Key: strings.Repeat("k", pulsar.MaxKeyBytes+1), Payload: []byte("x")},
		"payload too big": {Key: "a", Payload: make([]byte, lim.MaxPayloadBytes+1)},
		"reserved header": {Key: "a", Payload: []byte("x"), Headers: map[string]string{pulsar.PropID: "forged"}},
		"reserved prefix": {Key: "a", Payload: []byte("x"), Headers: map[string]string{"keyorder-reason": "x"}},
		"headers too big": {Key: "a", Payload: []byte("x"), Headers: map[string]string{"h": strings.Repeat("v", pulsar.MaxPropertyBytes)}},
		"missing key":     {Payload: []byte("x")},
	} {
		_, err := pub.Publish(ctx, m)
		if !errors.Is(err, keyorder.ErrInvalidMessage) && !errors.Is(err, keyorder.ErrMissingKey) {
			t.Errorf("%s: %v, want ErrInvalidMessage", name, err)
		}
		var le *keyorder.LimitError
		if name != "missing key" && !errors.As(err, &le) {
			t.Errorf("%s: %v is not a *keyorder.LimitError", name, err)
		}
		pub.ResumeAll()
	}
	emptyTopic(t, client, topicName)
}

func TestSubscriptionTypeMismatch(t *testing.T) {
	client := newClient(t)
	ctx := context.Background()
	topicName := uniqueTopic("mismatch")
	admin := os.Getenv("KEYORDER_PULSAR_ADMIN_URL")
	ordered, err := pulsar.OpenSubscriptionDriver(ctx, client, topicName, "s", &pulsar.SubscriptionOptions{Ordering: policy.Ordered})
	if err != nil {
		t.Fatal(err)
	}
	// With the ordered consumer attached the broker refuses a Shared one.
	_, err = pulsar.OpenSubscriptionDriver(ctx, client, topicName, "s", &pulsar.SubscriptionOptions{Ordering: policy.Parallel})
	if !errors.Is(err, pulsar.ErrOrderingMismatch) || ordered.ErrorCode(err) != keyorder.CodeFailedPrecondition {
		t.Fatalf("parallel while ordered attached = %v, want ErrOrderingMismatch", err)
	}
	ordered.Close()
	// With nobody attached, the admin API tells (the policy property).
	for _, o := range []policy.Ordering{policy.Parallel, policy.Exclusive} {
		_, err = pulsar.OpenSubscriptionDriver(ctx, client, topicName, "s", &pulsar.SubscriptionOptions{Ordering: o, AdminURL: admin})
		if !errors.Is(err, pulsar.ErrOrderingMismatch) || ordered.ErrorCode(err) != keyorder.CodeFailedPrecondition {
			t.Fatalf("%v after ordered = %v, want ErrOrderingMismatch", o, err)
		}
	}
	again, err := pulsar.OpenSubscriptionDriver(ctx, client, topicName, "s", &pulsar.SubscriptionOptions{Ordering: policy.Ordered, AdminURL: admin})
	if err != nil {
		t.Fatalf("reopen ordered: %v", err)
	}
	again.Close()
}

func TestURLOpener(t *testing.T) {
	ctx := context.Background()
	admin := os.Getenv("KEYORDER_PULSAR_ADMIN_URL")
	path := strings.TrimPrefix(uniqueTopic("url"), "persistent:/")
	pub, err := publish.Open(ctx, brokerURL(t, path+"?admin="+admin), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(ctx)
	drv, err := driver.DefaultMux().OpenSubscription(ctx, brokerURL(t, path+"?subscription=apply&ordering=ordered&receiver_queue=10&max_batch=5&lease=5s&admin="+admin))
	if err != nil {
		t.Fatal(err)
	}
	defer drv.Close()
	if c := drv.Capabilities(); c.Ordering != policy.Ordered || c.NativeHold || c.LeaseDuration != 5*time.Second || c.MaxBatch != 5 {
		t.Fatalf("capabilities %+v", c)
	}
	sticky, err := driver.DefaultMux().OpenSubscription(ctx, brokerURL(t, path+"?subscription=sticky&sticky=0-65535"))
	if err != nil {
		t.Fatalf("sticky: %v", err)
	}
	sticky.Close()
	if _, err := pub.Publish(ctx, &keyorder.Message{Key: "a", Payload: []byte("hello"), Headers: map[string]string{"h": "v"}}); err != nil {
		t.Fatal(err)
	}
	ms, err := drv.Receive(ctx, 5)
	if err != nil || len(ms) != 1 {
		t.Fatalf("receive: %v %v", ms, err)
	}
	m := ms[0]
	if m.Key != "a" || string(m.Payload) != "hello" || m.Headers["h"] != "v" || len(m.Headers) != 1 || m.Attempt != 1 || m.ID == "" {
		t.Fatalf("received %+v", m)
	}
	if err := drv.Ack(ctx, ms); err != nil {
		t.Fatal(err)
	}
}

// A dead letter is a message on <topic>-<subscription>-dead with its key,
// headers, ID, reason and attempts; the original is acknowledged.
func TestDeadLetterTopic(t *testing.T) {
	client := newClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topicName := uniqueTopic("dlq")
	drv, err := pulsar.OpenSubscriptionDriver(ctx, client, topicName, "apply", &pulsar.SubscriptionOptions{Ordering: policy.Ordered})
	if err != nil {
		t.Fatal(err)
	}
	defer drv.Close()
	topic, err := pulsar.OpenTopicDriver(ctx, client, topicName, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer topic.Close()
	if err := topic.SendBatch(ctx, []*driver.Message{{ID: "m1", Key: "acct-42", Payload: []byte("p"), Headers: map[string]string{"h": "v"}}}); err != nil {
		t.Fatal(err)
	}
	ms, err := drv.Receive(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.DeadLetter(ctx, ms[0], "permanent: bad account", 3); err != nil {
		t.Fatal(err)
	}
	r, err := client.CreateReader(gopulsar.ReaderOptions{Topic: pulsar.DeadLetterTopic(topicName, "apply"), StartMessageID: gopulsar.EarliestMessageID()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	m, err := r.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p := m.Properties()
	if m.Key() != "acct-42" || string(m.Payload()) != "p" || p[pulsar.PropID] != "m1" || p["h"] != "v" ||
		p[pulsar.PropReason] != "permanent: bad account" || p[pulsar.PropAttempts] != "3" || p[pulsar.PropDeadAt] == "" {
		t.Fatalf("dead letter key %q payload %q properties %v", m.Key(), m.Payload(), p)
	}
	dls, err := drv.DeadLetters(ctx, 0)
	if err != nil || len(dls) != 1 || dls[0].Message.ID != "m1" || dls[0].Attempts != 3 || dls[0].Message.Headers["h"] != "v" {
		t.Fatalf("DeadLetters = %+v, %v", dls, err)
	}
}

// TestRawDefaultBatcherSpreadsKeys documents why the driver never uses the
// client's default batcher: it packs many keys into one batch, and a
// Key_Shared subscription dispatches a batch by one key, so a key's messages
// reach several consumers (measured on Pulsar 4.0.7: every key of 197).
//
// The batches are capped at 20 messages and the keys number 197, a prime,
// so that batch boundaries never line up with the key cycle: with 200 keys
// and the default cap of 1,000 messages, a producer that fills whole batches
// starts every batch with key-0, the broker dispatches them all to key-0's
// consumer, and the test saw one consumer receive everything in 2 runs of 3.
func TestRawDefaultBatcherSpreadsKeys(t *testing.T) {
	client := newClient(t)
	topicName := uniqueTopic("defaultbatcher")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cs []gopulsar.Consumer
	for range 2 {
		c, err := client.Subscribe(gopulsar.ConsumerOptions{Topic: topicName, SubscriptionName: "s", Type: gopulsar.KeyShared,
			SubscriptionInitialPosition: gopulsar.SubscriptionPositionEarliest})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cs = append(cs, c)
	}
	// The default batcher (BatcherBuilderType unset), with a small cap.
	p, err := client.CreateProducer(gopulsar.ProducerOptions{Topic: topicName, BatchingMaxMessages: 20})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const n, keys = 4000, 197
	for i := range n {
		k := "key-" + strconv.Itoa(i%keys)
		p.SendAsync(ctx, &gopulsar.ProducerMessage{Key: k, OrderingKey: k, Payload: make([]byte, 100)}, nil)
	}
	if err := p.FlushWithCtx(ctx); err != nil {
		t.Fatal(err)
	}
	owners := map[string]map[int]bool{}
	for got := 0; got < n; got++ {
		var cm gopulsar.ConsumerMessage
		who := 0
		select {
		case cm = <-cs[0].Chan():
		case cm = <-cs[1].Chan():
			who = 1
		case <-ctx.Done():
			t.Fatalf("received %d of %d", got, n)
		}
		if owners[cm.Key()] == nil {
			owners[cm.Key()] = map[int]bool{}
		}
		owners[cm.Key()][who] = true
		cm.Consumer.Ack(cm.Message)
	}
	split := 0
	for _, o := range owners {
		if len(o) > 1 {
			split++
		}
	}
	if split == 0 {
		t.Fatalf("with the default batcher no key reached both consumers: the broker now dispatches batches by key; revisit ErrDefaultBatcher")
	}
	t.Logf("default batcher: %d of %d keys reached both consumers", split, len(owners))
}
