package pubsub_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/pubsub"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
)

func TestBadURLParameters(t *testing.T) {
	ctx := context.Background()
	for _, u := range []string{
		"pubsub://proj/topic?subscription=s&colour=blue",
		"pubsub://proj/topic?subscription=s&ordering=fifo",
		"pubsub://proj/topic?subscription=s&ackdeadline=5s",
		"pubsub://proj/topic?subscription=s&ackdeadline=soon",
		"pubsub://proj/topic?subscription=s&maxbatch=0",
		"pubsub://proj/topic?subscription=s&maxdeliveryattempts=200",
		"pubsub://proj/topic?ordering=ordered",
		"pubsub://proj/?subscription=s",
		"pubsub:///topic?subscription=s",
		"pubsub://proj/a/b?subscription=s",
	} {
		if _, err := driver.DefaultMux().OpenSubscription(ctx, u); !errors.Is(err, keyorder.ErrBadURL) {
			t.Errorf("OpenSubscription(%s) = %v, want ErrBadURL", u, err)
		}
	}
	for _, u := range []string{"pubsub://proj/topic?subscription=s", "pubsub://proj", "pubsub:///topic"} {
		if _, err := driver.DefaultMux().OpenTopic(ctx, u); !errors.Is(err, keyorder.ErrBadURL) {
			t.Errorf("OpenTopic(%s) = %v, want ErrBadURL", u, err)
		}
	}
}

// pstestEnv starts pstest and points PUBSUB_EMULATOR_HOST at it, so URL
// openers reach it the way they reach Google's emulator.
func pstestEnv(t *testing.T) *pstest.Server {
	srv := pstest.NewServer()
	t.Cleanup(func() { srv.Close() })
	t.Setenv("PUBSUB_EMULATOR_HOST", srv.Addr)
	return srv
}

func TestURLOpenerCreatesAndKeepsOrdering(t *testing.T) {
	pstestEnv(t)
	ctx := context.Background()
	pub, err := publish.Open(ctx, "pubsub://"+project+"/ledger", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(ctx)
	drv, err := driver.DefaultMux().OpenSubscription(ctx, "pubsub://"+project+"/ledger?subscription=apply&ordering=ordered&max_batch=5")
	if err != nil {
		t.Fatal(err)
	}
	defer drv.Close()
	if c := drv.Capabilities(); c.Ordering != policy.Ordered || c.NativeHold || c.LeaseDuration != 30*time.Second || c.MaxBatch != 5 {
		t.Fatalf("capabilities %+v", c)
	}
	// Opening it again with the same ordering works; with another fails.
	again, err := driver.DefaultMux().OpenSubscription(ctx, "pubsub://"+project+"/ledger?subscription=apply")
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	again.Close()
	_, err = driver.DefaultMux().OpenSubscription(ctx, "pubsub://"+project+"/ledger?subscription=apply&ordering=parallel")
	if !errors.Is(err, pubsub.ErrOrderingMismatch) || !errors.Is(err, keyorder.ErrFailedPrecondition) || keyorder.Code(err) != keyorder.CodeFailedPrecondition {
		t.Fatalf("reopen with parallel = %v, want ErrOrderingMismatch", err)
	}

	if _, err := pub.Publish(ctx, &keyorder.Message{ID: "101", Key: "acct-42", Payload: []byte("-500"), NotBefore: time.Now().Add(time.Hour).Round(0)}); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ms, err := drv.Receive(rctx, 10)
	if err != nil || len(ms) != 1 {
		t.Fatalf("Receive = %v, %v", ms, err)
	}
	m := ms[0]
	if m.ID != "101" || m.Key != "acct-42" || string(m.Payload) != "-500" || m.Attempt != 1 || m.NotBefore.IsZero() || len(m.Headers) != 0 {
		t.Fatalf("received %+v", m)
	}
	if err := drv.Ack(ctx, ms); err != nil {
		t.Fatal(err)
	}
}

// rawSetup makes a topic and an ordered subscription on a fresh pstest and
// returns the typed drivers.
func rawSetup(t *testing.T) (*pstest.Server, *pubsub.Topic, *pubsub.Subscription, string) {
	t.Helper()
	srv := pstestEnv(t)
	client := pstestClientFromEnv(t)
	ctx := context.Background()
	topicID, subID := uniqueID("t"), uniqueID("s")
	if err := pubsub.CreateTopic(ctx, client, topicID); err != nil {
		t.Fatal(err)
	}
	opts := &pubsub.SubscriptionOptions{Ordering: policy.Ordered, Lease: pubsub.MinAckDeadline}
	if err := pubsub.CreateSubscription(ctx, client, topicID, subID, opts); err != nil {
		t.Fatal(err)
	}
	topic, err := pubsub.OpenTopicDriver(ctx, client, topicID, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { topic.Close() })
	sub, err := pubsub.OpenSubscriptionDriver(ctx, client, subID, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	return srv, topic, sub, subID
}

func TestKeyTooLongRejectedBeforeSending(t *testing.T) {
	srv, topic, _, _ := rawSetup(t)
	p, err := publish.New(topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	_, err = p.Publish(context.Background(), &keyorder.Message{Key: strings.Repeat("k", 1025), Payload: []byte("x")})
	var le *keyorder.LimitError
	if !errors.As(err, &le) || le.Max != 1024 || le.Backend != "pubsub" {
		t.Fatalf("1025-byte key: %v, want a LimitError of 1024", err)
	}
	if _, err := p.Publish(context.Background(), &keyorder.Message{Key: strings.Repeat("k", 1024), Payload: []byte("x")}); err != nil {
		t.Fatalf("1024-byte key: %v", err)
	}
	if n := len(srv.Messages()); n != 1 {
		t.Fatalf("server has %d messages, want only the valid one", n)
	}
}

func TestOrderingKeyCarriedNatively(t *testing.T) {
	srv, topic, _, _ := rawSetup(t)
	p, err := publish.New(topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	if _, err := p.Publish(context.Background(), &keyorder.Message{
		ID: "m1", Key: "acct-42", Payload: []byte("x"),
		Headers: map[string]string{"trace": "abc", keyorder.HeaderPartitionKey: "acct-42"},
	}); err != nil {
		t.Fatal(err)
	}
	ms := srv.Messages()
	if len(ms) != 1 {
		t.Fatalf("server has %d messages", len(ms))
	}
	m := ms[0]
	if m.OrderingKey != "acct-42" {
		t.Fatalf("ordering key %q, want acct-42", m.OrderingKey)
	}
	for k, v := range m.Attributes {
		if v == "acct-42" || k == keyorder.HeaderPartitionKey {
			t.Fatalf("attribute %s=%s carries the key: %v", k, v, m.Attributes)
		}
	}
	if m.Attributes[pubsub.AttrID] != "m1" || m.Attributes["trace"] != "abc" {
		t.Fatalf("attributes %v", m.Attributes)
	}
	// Reserved attribute names are refused.
	err = topic.SendBatch(context.Background(), []*driver.Message{{Key: "k", Payload: []byte("x"), Headers: map[string]string{pubsub.AttrID: "forged"}}})
	if err == nil || topic.ErrorCode(err) != keyorder.CodeInvalidArgument {
		t.Fatalf("reserved header: %v", err)
	}
}

func TestDeadLetterTopicGetsReason(t *testing.T) {
	_, topic, sub, subID := rawSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := topic.SendBatch(ctx, []*driver.Message{{ID: "101", Key: "acct-42", Payload: []byte("-500"), Headers: map[string]string{"h": "v"}}}); err != nil {
		t.Fatal(err)
	}
	ms, err := sub.Receive(ctx, 1)
	if err != nil || len(ms) != 1 {
		t.Fatalf("Receive = %v, %v", ms, err)
	}
	reason := "account closed " + strings.Repeat("é", 600) // over the 1024-byte attribute limit
	if err := sub.DeadLetter(ctx, ms[0], reason, 3); err != nil {
		t.Fatal(err)
	}
	dl, err := sub.DeadLetters(ctx, 10)
	if err != nil || len(dl) != 1 {
		t.Fatalf("DeadLetters = %+v, %v", dl, err)
	}
	d := dl[0]
	if d.Message.ID != "101" || d.Message.Key != "acct-42" || string(d.Message.Payload) != "-500" || d.Attempts != 3 ||
		!strings.HasPrefix(d.Reason, "account closed") || len(d.Reason) > 1024 || d.Message.Headers["h"] != "v" || len(d.Message.Headers) != 1 {
		t.Fatalf("dead letter %+v", d)
	}
	// The dead-letter topic's raw message carries the reason as an attribute
	// and the key as ordering key.
	client := pstestClientFromEnv(t)
	resp, err := client.SubscriptionAdminClient.Pull(ctx, &pubsubpb.PullRequest{
		Subscription: "projects/" + project + "/subscriptions/" + subID + "-dead-sub", MaxMessages: 10,
	})
	if err != nil || len(resp.ReceivedMessages) != 1 {
		t.Fatalf("raw pull of dead letters = %v, %v", resp, err)
	}
	raw := resp.ReceivedMessages[0].Message
	if raw.OrderingKey != "acct-42" || raw.Attributes[pubsub.AttrAttempts] != "3" || !strings.HasPrefix(raw.Attributes[pubsub.AttrReason], "account closed") {
		t.Fatalf("raw dead letter %v", raw)
	}
	// The original is acknowledged: nothing more arrives on the subscription.
	short, cancel2 := context.WithTimeout(ctx, time.Second)
	defer cancel2()
	if ms, err := sub.Receive(short, 10); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("after DeadLetter, Receive = %v, %v", ms, err)
	}
}

// A failed keyed publish must not leave the key paused in the client
// library: keyorder's publisher owns pausing.
func TestFailedPublishResumesKeyInClient(t *testing.T) {
	pstestEnv(t)
	client := pstestClientFromEnv(t)
	ctx := context.Background()
	topicID := uniqueID("t")
	topic, err := pubsub.OpenTopicDriver(ctx, client, topicID, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer topic.Close()
	send := func() error {
		return topic.SendBatch(ctx, []*driver.Message{{ID: "1", Key: "k", Payload: []byte("x")}, {ID: "2", Key: "k", Payload: []byte("y")}})
	}
	err = send() // the topic does not exist yet
	if err == nil || topic.ErrorCode(err) != keyorder.CodeNotFound || topic.IsRetryable(err) {
		t.Fatalf("publish to a missing topic = %v (code %v, retryable %v), want NotFound, not retryable", err, topic.ErrorCode(err), topic.IsRetryable(err))
	}
	if err := pubsub.CreateTopic(ctx, client, topicID); err != nil {
		t.Fatal(err)
	}
	if err := send(); err != nil {
		t.Fatalf("publish of the key after the failure = %v, want it sent (the client library's pause resumed)", err)
	}
}

// A lease that ran out before ExtendLeases is reported lost, and Pub/Sub
// redelivers the message with its attempt counted.
func TestExpiredLeaseReportedLost(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a 10s ack deadline")
	}
	_, topic, sub, _ := rawSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := topic.SendBatch(ctx, []*driver.Message{{ID: "a1", Key: "A", Payload: []byte("a1")}, {ID: "a2", Key: "A", Payload: []byte("a2")}}); err != nil {
		t.Fatal(err)
	}
	ms, err := sub.Receive(ctx, 1)
	if err != nil || len(ms) != 1 || ms[0].ID != "a1" {
		t.Fatalf("Receive = %v, %v", ms, err)
	}
	lease := sub.Capabilities().LeaseDuration
	if lost, err := sub.ExtendLeases(ctx, ms); err != nil || len(lost) != 0 {
		t.Fatalf("fresh lease: lost %v, %v", lost, err)
	}
	time.Sleep(lease + 500*time.Millisecond)
	lost, err := sub.ExtendLeases(ctx, ms)
	if err != nil || len(lost) != 1 || lost[0] != ms[0] {
		t.Fatalf("expired lease: lost %v, %v; want a1", lost, err)
	}
	again, err := sub.Receive(ctx, 10)
	if err != nil || len(again) == 0 || again[0].ID != "a1" || again[0].Attempt != 2 {
		t.Fatalf("after expiry Receive = %+v, %v; want a1 first with attempt 2", again, err)
	}
}

// A subscription the URL opener fails to create reports why at Open, not a
// NotFound from opening what was never created.
func TestURLOpenerReturnsCreationError(t *testing.T) {
	srv := pstest.NewServer(pstest.WithErrorInjection("CreateSubscription", codes.PermissionDenied, "caller lacks pubsub.subscriptions.create"))
	t.Cleanup(func() { srv.Close() })
	t.Setenv("PUBSUB_EMULATOR_HOST", srv.Addr)
	ctx := context.Background()
	drv, err := driver.DefaultMux().OpenSubscription(ctx, "pubsub://"+project+"/ledger?subscription=apply")
	if err == nil {
		drv.Close()
		t.Fatal("Open succeeded although the subscription could not be created")
	}
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("Open = %v, want the creation's PermissionDenied", err)
	}
	if !strings.Contains(err.Error(), "create subscription") || !strings.Contains(err.Error(), "pubsub.subscriptions.create") {
		t.Fatalf("Open = %v, want the creation failure named", err)
	}
}

// logRecorder is a slog.Handler keeping the messages it is given.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Message)
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

func (l *logRecorder) contains(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.msgs {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

// What the driver cannot return it logs on the injected logger: here a
// not-before attribute that does not parse (a message not published by
// keyorder), delivered without a delay.
func TestSubscriptionLogsOnInjectedLogger(t *testing.T) {
	pstestEnv(t)
	client := pstestClientFromEnv(t)
	ctx := context.Background()
	topicID, subID := uniqueID("t"), uniqueID("s")
	if err := pubsub.CreateTopic(ctx, client, topicID); err != nil {
		t.Fatal(err)
	}
	var rec logRecorder
	opts := &pubsub.SubscriptionOptions{Ordering: policy.Ordered, Logger: slog.New(&rec)}
	if err := pubsub.CreateSubscription(ctx, client, topicID, subID, opts); err != nil {
		t.Fatal(err)
	}
	sub, err := pubsub.OpenSubscriptionDriver(ctx, client, subID, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	pub := client.Publisher(topicID)
	defer pub.Stop()
	if _, err := pub.Publish(ctx, &gpubsub.Message{Data: []byte("x"), Attributes: map[string]string{pubsub.AttrNotBefore: "tomorrow"}}).Get(ctx); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ms, err := sub.Receive(rctx, 1)
	if err != nil || len(ms) != 1 || !ms[0].NotBefore.IsZero() {
		t.Fatalf("Receive = %v, %v; want the message without a not-before time", ms, err)
	}
	if !rec.contains("not-before") {
		t.Fatalf("logged %v; want the unparsable not-before attribute reported", rec.msgs)
	}
}
