package kafka_test

// This file: the public surface as an application meets it through URLs
// and the typed constructors, with input it should refuse.

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/kafka"
	"github.com/keyorder/keyorder/integration/drivertest"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// TestURLMissingTopic: opening a topic that does not exist, without
// create=true, fails with an error matching keyorder.ErrNotFound that
// names the topic and says how to create it, well before the opener's
// 30-second connect bound (which used to end it with "context deadline
// exceeded", and made keyorder stats exit 1 after its --timeout).
func TestURLMissingTopic(t *testing.T) {
	name := uniqueName("missing")
	base := "kafka://" + strings.Join(brokers(t), ",") + "/" + name
	for what, open := range map[string]func(context.Context) error{
		"publish.Open": func(ctx context.Context) error {
			_, err := publish.Open(ctx, base, nil)
			return err
		},
		"subscribe.Open": func(ctx context.Context) error {
			_, err := subscribe.Open(ctx, base+"?group=g", nil)
			return err
		},
		"kafka.OpenSubscription": func(ctx context.Context) error {
			_, err := kafka.OpenSubscription(ctx, name, "g", subOptions(t, drivertest.Spec{}), nil)
			return err
		},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := open(ctx)
		cancel()
		if !errors.Is(err, keyorder.ErrNotFound) || errors.Is(err, context.DeadlineExceeded) ||
			!strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "create=true") {
			t.Errorf("%s of a missing topic: %v; want ErrNotFound naming %s and create=true", what, err, name)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Nothing created it on the way.
	tds, err := kadm.NewClient(newClient(t)).ListTopics(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if tds.Has(name) {
		t.Errorf("topic %s exists after the failed opens", name)
	}
}

// TestURLMaxMessageSize: max_message_size raises the payload limit to the
// broker's (here the topic's max.message.bytes of 3,000,000): a payload
// of 2 MB is published, consumed, dead-lettered and listed whole; one
// byte over the limit is a LimitError and nothing is sent.
func TestURLMaxMessageSize(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := newClient(t)
	adm := kadm.NewClient(cl)
	name := uniqueName("big")
	size := "3000000"
	if r, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"max.message.bytes": &size}, name); err != nil || r.Err != nil {
		t.Fatalf("create %s: %v %v", name, err, r.Err)
	}
	base := "kafka://" + strings.Join(brokers(t), ",") + "/" + name
	pub, err := publish.Open(ctx, base+"?max_message_size="+size, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(context.Background())
	if got, want := pub.Limits().MaxPayloadBytes, 3_000_000-kafka.MetadataRoom; got != want {
		t.Errorf("payload limit %d, want %d", got, want)
	}
	_, err = pub.Publish(ctx, &keyorder.Message{Key: "k", Payload: make([]byte, pub.Limits().MaxPayloadBytes+1)})
	var le *keyorder.LimitError
	if !errors.As(err, &le) || !errors.Is(err, keyorder.ErrInvalidMessage) {
		t.Fatalf("payload over the limit: %v, want a LimitError", err)
	}
	// Random bytes: the producer compresses, and a pattern would fit the
	// broker's limits compressed.
	big := make([]byte, 2_000_000)
	rand.Read(big)
	if _, err := pub.Publish(ctx, &keyorder.Message{Key: "k", Payload: big}); err != nil {
		t.Fatalf("2 MB payload under max_message_size=%s: %v", size, err)
	}
	sub, err := subscribe.Open(ctx, base+"?group="+uniqueName("g")+"&session_timeout=6s&max_message_size="+size, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	got := make(chan int, 1)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- sub.Run(rctx, func(_ context.Context, d *keyorder.Delivery) error {
			got <- len(d.Payload)
			return keyorder.Permanent(errors.New("too big to apply"))
		})
	}()
	select {
	case n := <-got:
		if n != len(big) {
			t.Fatalf("received %d bytes, want %d", n, len(big))
		}
	case <-ctx.Done():
		t.Fatal("the 2 MB record was not delivered")
	}
	var dls []keyorder.DeadLetter
	for ctx.Err() == nil {
		if dls, err = sub.DeadLetters(ctx, 0); err == nil && len(dls) == 1 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	stop()
	<-done
	if len(dls) != 1 || len(dls[0].Message.Payload) != len(big) || string(dls[0].Message.Payload) != string(big) {
		t.Fatalf("dead letters: %d, %v (want the 2 MB record)", len(dls), err)
	}
	if st, _ := sub.Stats(ctx); st.DeadLettered != 1 {
		t.Errorf("dead-lettered %d, want 1", st.DeadLettered)
	}
	// Redrive produces it on the topic again.
	if n, err := sub.Redrive(ctx, []string{dls[0].Message.ID}); n != 1 || err != nil {
		t.Fatalf("redrive: %d, %v", n, err)
	}
	ends, err := adm.ListEndOffsets(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := ends.Lookup(name, 0); o.Offset != 2 {
		t.Errorf("end offset %d after the redrive, want 2 (the record and its redrive)", o.Offset)
	}
}

// TestOpenTopicBatchLimit: OpenTopic with TopicOptions.MaxMessageBytes
// above the client's ProducerBatchMaxBytes is ErrInvalidConfig naming the
// option to give (franz-go would refuse such records after the limits let
// them through); a client whose batch limit is below the default record
// size lowers the payload limit to fit it. No broker needed: nothing is
// sent.
func TestOpenTopicBatchLimit(t *testing.T) {
	ctx := context.Background()
	client := func(opts ...kgo.Opt) *kgo.Client {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	_, err := kafka.OpenTopic(ctx, client(), "t", &kafka.TopicOptions{MaxMessageBytes: 3_000_000}, nil)
	if !errors.Is(err, keyorder.ErrInvalidConfig) || !strings.Contains(err.Error(), "ProducerBatchMaxBytes(3000000)") {
		t.Errorf("MaxMessageBytes above the client's batch limit: %v, want ErrInvalidConfig naming ProducerBatchMaxBytes(3000000)", err)
	}
	pub, err := kafka.OpenTopic(ctx, client(kgo.ProducerBatchMaxBytes(3_000_000)), "t", &kafka.TopicOptions{MaxMessageBytes: 3_000_000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := pub.Limits().MaxPayloadBytes; got != 3_000_000-kafka.MetadataRoom {
		t.Errorf("payload limit %d with a client that takes 3,000,000 bytes", got)
	}
	pub.Close(ctx)
	pub, err = kafka.OpenTopic(ctx, client(kgo.ProducerBatchMaxBytes(500_000)), "t", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := pub.Limits().MaxPayloadBytes; got != 500_000-kafka.MetadataRoom {
		t.Errorf("payload limit %d with a client batch limit of 500,000, want %d", got, 500_000-kafka.MetadataRoom)
	}
	pub.Close(ctx)
}

// TestOpenSubscriptionBadGroup: a group whose dead-letter topic
// (<topic>.<group>.dead) would not be a legal topic name is refused at
// open: the broker refuses that topic, so a dead letter could never be
// written and its message would come back forever. No broker needed.
func TestOpenSubscriptionBadGroup(t *testing.T) {
	// A cancelled context: an open that gets past the check ends at once.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	opts := &kafka.SubscriptionOptions{ClientOptions: []kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")}}
	for _, group := range []string{"ops blue", "ops:blue", strings.Repeat("g", 243)} {
		_, err := kafka.OpenSubscription(ctx, "t", group, opts, nil)
		if !errors.Is(err, keyorder.ErrInvalidConfig) || !strings.Contains(err.Error(), ".dead") {
			t.Errorf("group %.20q: %v, want ErrInvalidConfig about the dead-letter topic", group, err)
		}
	}
	// 242 = 249 - len("t") - len("..dead"): allowed.
	if _, err := kafka.OpenSubscription(ctx, "t", strings.Repeat("g", 242), opts, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("a group of 242 characters on topic t (dead-letter topic of 249): %v, want the context's error", err)
	}
}

// TestRejectsBeforeSending: a batch with one message the limits refuse
// (key, payload or headers too large, a reserved header, no key under
// policy.Reject) fails with the typed error naming its index, and nothing
// of the batch reaches the topic, the valid messages before it included.
func TestRejectsBeforeSending(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := newClient(t)
	name := createTopic(ctx, t, cl, 1)
	pub, err := publish.Open(ctx, "kafka://"+strings.Join(brokers(t), ",")+"/"+name, &publish.Config{MissingKey: policy.Reject})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(context.Background())
	l := pub.Limits()
	ok := &keyorder.Message{Key: "k", Payload: []byte("fine")}
	for _, tc := range []struct {
		what  string
		m     *keyorder.Message
		limit bool // a *keyorder.LimitError (else ErrMissingKey)
	}{
		{"key over the limit", &keyorder.Message{Key: strings.Repeat("k", l.MaxKeyBytes+1), Payload: []byte("x")}, true},
		{"payload over the limit", &keyorder.Message{Key: "k", Payload: make([]byte, l.MaxPayloadBytes+1)}, true},
		{"headers over the limit", &keyorder.Message{Key: "k", Payload: []byte("x"), Headers: map[string]string{"h": strings.Repeat("v", kafka.MaxHeaderBytes)}}, true},
		{"reserved header", &keyorder.Message{Key: "k", Payload: []byte("x"), Headers: map[string]string{kafka.HeaderID: "x"}}, true},
		{"no key", &keyorder.Message{Payload: []byte("x")}, false},
	} {
		ids, err := pub.PublishBatch(ctx, []*keyorder.Message{ok, ok, tc.m})
		var le *keyorder.LimitError
		switch {
		case ids != nil || !strings.Contains(fmt.Sprint(err), "message 2"):
			t.Errorf("%s: ids %v, error %v; want no IDs and an error naming message 2", tc.what, ids, err)
		case tc.limit && (!errors.As(err, &le) || !errors.Is(err, keyorder.ErrInvalidMessage) || le.Backend != "kafka"):
			t.Errorf("%s: %v, want a kafka LimitError matching ErrInvalidMessage", tc.what, err)
		case !tc.limit && !errors.Is(err, keyorder.ErrMissingKey):
			t.Errorf("%s: %v, want ErrMissingKey", tc.what, err)
		}
	}
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := ends.Lookup(name, 0); o.Err != nil || o.Offset != 0 {
		t.Errorf("end offset %d (%v) after the refused batches, want 0: something was sent", o.Offset, o.Err)
	}
	// The publisher is not paused by them: a valid message goes.
	if _, err := pub.Publish(ctx, ok); err != nil {
		t.Errorf("publish after the refusals: %v", err)
	}
}

// TestURLSmallTopicLimit: a topic whose max.message.bytes is below the
// default (here 200,000) lowers the payload limit of a URL opened without
// max_message_size: a payload the broker would refuse fails before it is
// sent, with a LimitError, and does not pause its key.
func TestURLSmallTopicLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	adm := kadm.NewClient(newClient(t))
	name := uniqueName("small")
	size := "200000"
	if r, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"max.message.bytes": &size}, name); err != nil || r.Err != nil {
		t.Fatalf("create %s: %v %v", name, err, r.Err)
	}
	pub, err := publish.Open(ctx, "kafka://"+strings.Join(brokers(t), ",")+"/"+name, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(context.Background())
	if got, want := pub.Limits().MaxPayloadBytes, 200_000-kafka.MetadataRoom; got != want {
		t.Errorf("payload limit %d on a topic of max.message.bytes=%s, want %d", got, size, want)
	}
	payload := make([]byte, 250_000)
	rand.Read(payload)
	_, err = pub.Publish(ctx, &keyorder.Message{Key: "k", Payload: payload})
	var le *keyorder.LimitError
	if !errors.As(err, &le) {
		t.Errorf("250,000 bytes to a topic of max.message.bytes=%s: %v, want a LimitError", size, err)
	}
	if p := pub.Paused(); len(p) != 0 {
		t.Errorf("paused keys %q after a refused payload", p)
	}
	fits := make([]byte, pub.Limits().MaxPayloadBytes)
	rand.Read(fits)
	if _, err := pub.Publish(ctx, &keyorder.Message{Key: "k", Payload: fits}); err != nil {
		t.Errorf("a payload of the limit: %v", err)
	}
}

// TestEmptyPayloadNotTombstone: a message with an empty payload is a
// record with an empty value, not a null one: Kafka's log compaction takes
// a null value for a tombstone that deletes the key's records.
func TestEmptyPayloadNotTombstone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := newClient(t)
	name := createTopic(ctx, t, cl, 1)
	pub, err := publish.Open(ctx, "kafka://"+strings.Join(brokers(t), ",")+"/"+name, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(context.Background())
	for _, p := range [][]byte{nil, {}} {
		if _, err := pub.Publish(ctx, &keyorder.Message{Key: "k", Payload: p}); err != nil {
			t.Fatal(err)
		}
	}
	rd := newClient(t, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{name: {0: kgo.NewOffset().AtStart()}}))
	var recs []*kgo.Record
	for len(recs) < 2 && ctx.Err() == nil {
		rd.PollFetches(ctx).EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	}
	if len(recs) != 2 {
		t.Fatalf("read %d records, want 2", len(recs))
	}
	for i, r := range recs {
		if r.Value == nil {
			t.Errorf("record %d has a null value (a tombstone)", i)
		}
	}
}

// TestURLCreateMaxMessageSize: a topic that create=true creates under
// max_message_size takes records of that size (it was created with the
// broker's default max.message.bytes, which refused them).
func TestURLCreateMaxMessageSize(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	name := uniqueName("bigcreated")
	pub, err := publish.Open(ctx, "kafka://"+strings.Join(brokers(t), ",")+"/"+name+"?create=true&max_message_size=3000000", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(context.Background())
	big := make([]byte, 2_000_000)
	rand.Read(big)
	if _, err := pub.Publish(ctx, &keyorder.Message{Key: "k", Payload: big}); err != nil {
		t.Errorf("2 MB to a topic created with max_message_size=3000000: %v", err)
	}
}

// TestDeadLettersAfterRetention: when retention has deleted every record
// of a dead-letter partition (its start offset reaches its end; here
// DeleteRecords does what retention.ms does after a week), listing the
// dead letters returns what is left at once instead of waiting, until its
// context ends, for records that no longer exist (keyorder stats and dead
// list timed out).
func TestDeadLettersAfterRetention(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := newClient(t)
	adm := kadm.NewClient(cl)
	name := createTopic(ctx, t, cl, 1)
	group := uniqueName("g")
	base := "kafka://" + strings.Join(brokers(t), ",") + "/" + name
	pub, err := publish.Open(ctx, base, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(context.Background())
	if _, err := pub.Publish(ctx, &keyorder.Message{Key: "k", Payload: []byte("old")}); err != nil {
		t.Fatal(err)
	}
	sub, err := subscribe.Open(ctx, base+"?group="+group+"&session_timeout=6s", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	dls, stop := deadLetterAll(ctx, sub, "no")
	stop()
	if len(dls) != 1 {
		t.Fatalf("dead letters %d, want 1", len(dls))
	}
	dead := kafka.DeadLetterTopic(name, group)
	ends, err := adm.ListEndOffsets(ctx, dead)
	if err != nil {
		t.Fatal(err)
	}
	del := kadm.Offsets{}
	ends.Each(func(o kadm.ListedOffset) { del.Add(kadm.Offset{Topic: o.Topic, Partition: o.Partition, At: o.Offset}) })
	if _, err := adm.DeleteRecords(ctx, del); err != nil {
		t.Fatal(err)
	}
	lctx, lcancel := context.WithTimeout(ctx, 15*time.Second)
	defer lcancel()
	dls, err = sub.DeadLetters(lctx, 0)
	if err != nil || len(dls) != 0 {
		t.Errorf("dead letters after retention deleted them: %d, %v; want none and no error", len(dls), err)
	}
}

// TestDeadLetterForeignRecord: a record another producer wrote, with
// headers the publisher's limits would refuse (32 KiB and more, a name
// with the reserved prefix), can be dead-lettered and listed: the record
// exists already, and a dead letter that cannot be written brings its
// message back forever.
func TestDeadLetterForeignRecord(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := newClient(t)
	name := createTopic(ctx, t, cl, 1)
	big := strings.Repeat("v", kafka.MaxHeaderBytes+1)
	r := &kgo.Record{Topic: name, Key: []byte("k"), Value: []byte("foreign"), Headers: []kgo.RecordHeader{
		{Key: "trace", Value: []byte(big)}, {Key: kafka.HeaderReason, Value: []byte("forged")},
	}}
	if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
		t.Fatal(err)
	}
	sub, err := subscribe.Open(ctx, "kafka://"+strings.Join(brokers(t), ",")+"/"+name+"?group="+uniqueName("g")+"&session_timeout=6s", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	dls, stop := deadLetterAll(ctx, sub, "cannot apply")
	defer stop()
	if len(dls) != 1 || string(dls[0].Message.Payload) != "foreign" || dls[0].Message.Headers["trace"] != big ||
		!strings.Contains(dls[0].Reason, "cannot apply") {
		st, _ := sub.Stats(ctx)
		t.Fatalf("dead letters %d (settle failures %d), want the foreign record with its header and the handler's reason", len(dls), st.SettleFailures)
	}
	if n, err := sub.Redrive(ctx, []string{dls[0].Message.ID}); n != 1 || err != nil {
		t.Errorf("redrive of the foreign record: %d, %v", n, err)
	}
}

// TestLimitsAtOnce: a message at every limit at once (key, headers and
// payload, random bytes the producer cannot compress) is published,
// delivered and dead-lettered with a reason of the longest kept: the
// limits leave room for the record's overhead and the dead letter's
// headers under the broker's default 1 MiB.
func TestLimitsAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := newClient(t)
	name := createTopic(ctx, t, cl, 1)
	base := "kafka://" + strings.Join(brokers(t), ",") + "/" + name
	pub, err := publish.Open(ctx, base, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(context.Background())
	l := pub.Limits()
	payload := make([]byte, l.MaxPayloadBytes)
	rand.Read(payload)
	hv := make([]byte, l.MaxHeaderBytes/2)
	rand.Read(hv)
	for i := range hv {
		hv[i] = 'a' + hv[i]%26
	}
	m := &keyorder.Message{Key: strings.Repeat("k", l.MaxKeyBytes), Payload: payload, Headers: map[string]string{"h": string(hv), "g": string(hv[:len(hv)-2])}}
	if _, err := pub.Publish(ctx, m); err != nil {
		t.Fatalf("a message at every limit: %v", err)
	}
	sub, err := subscribe.Open(ctx, base+"?group="+uniqueName("g")+"&session_timeout=6s", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	dls, stop := deadLetterAll(ctx, sub, strings.Repeat("r", 10000))
	defer stop()
	if len(dls) != 1 || len(dls[0].Message.Payload) != len(payload) || len(dls[0].Message.Key) != l.MaxKeyBytes {
		st, _ := sub.Stats(ctx)
		t.Fatalf("dead letters %d (settle failures %d), want the message at every limit", len(dls), st.SettleFailures)
	}
}

// deadLetterAll runs sub with a handler that fails every message
// permanently with reason until DeadLetters lists at least one (or ctx
// ends), and returns what it listed and the function that stops Run.
func deadLetterAll(ctx context.Context, sub *subscribe.Subscriber, reason string) ([]keyorder.DeadLetter, func()) {
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- sub.Run(rctx, func(context.Context, *keyorder.Delivery) error { return keyorder.Permanent(errors.New(reason)) })
	}()
	var dls []keyorder.DeadLetter
	for ctx.Err() == nil {
		var err error
		if dls, err = sub.DeadLetters(ctx, 0); err == nil && len(dls) > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return dls, func() { stop(); <-done }
}
