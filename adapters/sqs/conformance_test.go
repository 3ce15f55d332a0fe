package sqs_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/keyorder/keyorder/adapters/sqs"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/integration/drivertest"
	"github.com/keyorder/keyorder/internal/testenv"
)

// harness runs the suite on ElasticMQ; each case gets its own queue.
type harness struct {
	client      *awssqs.Client
	oldestFirst bool
	unsupported map[string]string
}

var seq atomic.Int64

// uniqueQueue returns a FIFO queue name no other case or run uses.
func uniqueQueue(prefix string) string {
	return fmt.Sprintf("%s-%d-%d.fifo", prefix, time.Now().UnixNano(), seq.Add(1))
}

func newClient(t *testing.T) (*awssqs.Client, string) {
	t.Helper()
	endpoint := testenv.Require(t, testenv.SQS)
	return awssqs.New(awssqs.Options{
		BaseEndpoint: aws.String(endpoint),
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		Retryer:      aws.NopRetryer{},
		HTTPClient:   sqs.NewHTTPClient(),
	}), endpoint
}

func (h *harness) Capabilities() drivertest.Capabilities {
	return drivertest.Capabilities{Unit: 250 * time.Millisecond, Unsupported: unsupportedWith(h.unsupported)}
}

func (h *harness) MakePair(ctx context.Context, t *testing.T, spec drivertest.Spec) (*drivertest.Pair, error) {
	return makePair(ctx, t, h.client, spec, h.oldestFirst)
}

func makePair(ctx context.Context, t *testing.T, client *awssqs.Client, spec drivertest.Spec, oldestFirst bool) (*drivertest.Pair, error) {
	name := uniqueQueue("c")
	opts := &sqs.Options{Ordering: spec.Ordering, Lease: spec.LeaseDuration, WaitTime: time.Second, OldestFirst: oldestFirst}
	qurl, err := sqs.CreateQueue(ctx, client, name, opts)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { deleteQueues(client, qurl) })
	topic, err := sqs.OpenTopicDriver(ctx, client, qurl, nil)
	if err != nil {
		return nil, err
	}
	return &drivertest.Pair{
		Topic: topic,
		OpenConsumer: func(ctx context.Context) (driver.Subscription, error) {
			return sqs.OpenSubscriptionDriver(ctx, client, qurl, opts)
		},
	}, nil
}

func deleteQueues(client *awssqs.Client, qurl string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: aws.String(qurl)})
	dead := qurl[:len(qurl)-len(".fifo")] + "-dead.fifo"
	client.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: aws.String(dead)})
}

// TestConformance runs the suite with the default receive, which takes
// SQS's choice of messages.
func TestConformance(t *testing.T) {
	client, _ := newClient(t)
	drivertest.Run(t, &harness{client: client, unsupported: map[string]string{
		"WorkedExample": "by default Receive takes the messages SQS chooses, and SQS does not hand out the oldest " +
			"deliverable message first (measured on ElasticMQ: receive(2) of a1(A) a2(A) s1 b1(B) s2 a3(A) b2(B) returns " +
			"a1 a2, and then receive(1) returns b1 before s1), so with 2 workers and MaxOutstanding 2 the schedule " +
			"differs; the example runs in TestConformanceOldestFirst, with Options.OldestFirst",
	}})
}

// TestConformanceOldestFirst runs the suite with Options.OldestFirst.
func TestConformanceOldestFirst(t *testing.T) {
	client, _ := newClient(t)
	drivertest.Run(t, &harness{client: client, oldestFirst: true})
}

// noCompaction is why an SQS FIFO queue cannot compact.
const noCompaction = "a message is deleted only with the receipt handle of a receive, and SQS FIFO hands out nothing " +
	"of a message group behind its head while the head is in flight, so the waiting messages of a " +
	"key cannot be reached to supersede them; SQS has no delete by key or by deduplication ID"

// unsupportedWith returns m plus the compaction case (noCompaction).
func unsupportedWith(m map[string]string) map[string]string {
	out := map[string]string{"CompactionDeliversNewest": noCompaction}
	for k, v := range m {
		out[k] = v
	}
	return out
}
