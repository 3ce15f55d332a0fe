package sqs_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/keyorder/keyorder/adapters/sqs"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/testenv"
	"github.com/keyorder/keyorder/policy"
)

// gate is an HTTP client that counts the calls of one SQS API (by
// X-Amz-Target) in flight at once. Armed, it holds each such call until
// want of them are in flight (or gateWait has passed), so calls made one
// after another show as one in flight, and calls made at once as all of
// them, whatever the machine's speed.
type gate struct {
	next   aws.HTTPClient
	target string
	want   int

	mu       sync.Mutex
	armed    bool
	inflight int
	peak     int
	calls    int
	full     chan struct{}
}

// gateWait bounds how long an armed gate holds a call.
const gateWait = 3 * time.Second

func newGate(target string, want int) *gate {
	return &gate{next: sqs.NewHTTPClient(), target: "AmazonSQS." + target, want: want}
}

// arm starts holding calls and resets the counts.
func (g *gate) arm() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed, g.peak, g.calls, g.full = true, 0, 0, make(chan struct{})
}

// counts returns the most calls in flight at once and the calls made since
// arm.
func (g *gate) counts() (peak, calls int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.peak, g.calls
}

func (g *gate) Do(req *http.Request) (*http.Response, error) {
	if req.Header.Get("X-Amz-Target") != g.target {
		return g.next.Do(req)
	}
	g.mu.Lock()
	g.inflight++
	g.calls++
	g.peak = max(g.peak, g.inflight)
	full := g.full
	if g.armed && g.inflight == g.want {
		close(full)
	}
	armed := g.armed
	g.mu.Unlock()
	if armed {
		t := time.NewTimer(gateWait)
		select {
		case <-full:
		case <-t.C:
		}
		t.Stop()
	}
	resp, err := g.next.Do(req)
	g.mu.Lock()
	g.inflight--
	g.mu.Unlock()
	return resp, err
}

// openGated opens a subscription driver whose client passes through g,
// with a topic on the same fresh queue.
func openGated(t *testing.T, g *gate) (*sqs.Topic, *sqs.Subscription) {
	t.Helper()
	endpoint := testenv.Require(t, testenv.SQS)
	client := awssqs.New(awssqs.Options{
		BaseEndpoint: aws.String(endpoint),
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		Retryer:      aws.NopRetryer{},
		HTTPClient:   g,
	})
	opts := &sqs.Options{Ordering: policy.Ordered, Lease: 60 * time.Second, WaitTime: time.Second}
	ctx := t.Context()
	q, err := sqs.CreateQueue(ctx, client, uniqueQueue("g"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteQueues(client, q) })
	topic, err := sqs.OpenTopicDriver(ctx, client, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := sqs.OpenSubscriptionDriver(ctx, client, q, opts)
	if err != nil {
		t.Fatal(err)
	}
	return topic, sub
}

// sendKeys sends n messages, each of a key of its own.
func sendKeys(t *testing.T, topic *sqs.Topic, n int) {
	t.Helper()
	var ms []*driver.Message
	for i := range n {
		ms = append(ms, &driver.Message{ID: fmt.Sprintf("%s/%d", t.Name(), i), Key: fmt.Sprintf("k%d", i), Payload: []byte("p")})
	}
	if err := topic.SendBatch(t.Context(), ms); err != nil {
		t.Fatal(err)
	}
}

// TestAckDeletesInCallsAtOnce checks that an Ack of 40 messages makes its
// four DeleteMessageBatch calls at once. The subscriber acknowledges from
// one goroutine (each Ack call takes what queued up meanwhile), so calls
// made one after another bounded a consumer to 10 messages per round trip
// of the acknowledgements, behind the receives.
func TestAckDeletesInCallsAtOnce(t *testing.T) {
	g := newGate("DeleteMessageBatch", 4)
	topic, sub := openGated(t, g)
	sendKeys(t, topic, 40)
	var got []*driver.Message
	for deadline := time.Now().Add(30 * time.Second); len(got) < 40 && time.Now().Before(deadline); {
		ms, _ := receive(t, sub, 40-len(got), 5*time.Second)
		got = append(got, ms...)
	}
	if len(got) != 40 {
		t.Fatalf("received %d of 40", len(got))
	}
	g.arm()
	if err := sub.Ack(t.Context(), got); err != nil {
		t.Fatal(err)
	}
	if peak, calls := g.counts(); calls != 4 || peak != 4 {
		t.Fatalf("Ack of 40 made %d DeleteMessageBatch calls, at most %d at once; want 4, all at once", calls, peak)
	}
	if ms, _ := receive(t, sub, 10, 2*time.Second); len(ms) != 0 {
		t.Fatalf("%d acknowledged messages came back", len(ms))
	}
}

// TestReceiveUnderBacklogAsksAtOnce checks that a Receive following one
// that got all it asked for makes all its ReceiveMessage calls at once,
// rather than one call and, once that came back full, the rest: one
// subscriber receives from one goroutine, so two round trips per Receive
// halved what a consumer received per round trip under a backlog.
func TestReceiveUnderBacklogAsksAtOnce(t *testing.T) {
	g := newGate("ReceiveMessage", 4)
	topic, sub := openGated(t, g)
	sendKeys(t, topic, 100)
	first, _ := receive(t, sub, 40, 10*time.Second)
	if len(first) != 40 {
		t.Fatalf("first Receive got %d of 40 (100 queued)", len(first))
	}
	g.arm()
	second, _ := receive(t, sub, 40, 10*time.Second)
	if len(second) != 40 {
		t.Fatalf("second Receive got %d of 40 (60 queued)", len(second))
	}
	if peak, calls := g.counts(); calls != 4 || peak != 4 {
		t.Fatalf("Receive of 40 under a backlog made %d ReceiveMessage calls, at most %d at once; want 4, all at once", calls, peak)
	}
	seen := map[string]bool{}
	for _, m := range append(first, second...) {
		if seen[m.ID] {
			t.Fatalf("%s received twice", m.ID)
		}
		seen[m.ID] = true
	}
}
