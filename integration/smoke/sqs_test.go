package smoke

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/keyorder/keyorder/internal/testenv"
)

// TestSQSFIFOGroupBlocking checks that the SQS server blocks a FIFO message
// group while one of its messages is in flight, serves other groups meanwhile,
// and releases the group's next message once the first is deleted.
func TestSQSFIFOGroupBlocking(t *testing.T) {
	endpoint := testenv.Require(t, testenv.SQS)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	client := sqs.New(sqs.Options{
		BaseEndpoint: aws.String(endpoint),
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
	})

	name := "smoke-" + strconv.FormatInt(time.Now().UnixNano(), 36) + ".fifo"
	created, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{
		QueueName: aws.String(name),
		Attributes: map[string]string{
			"FifoQueue":                 "true",
			"ContentBasedDeduplication": "false",
			"VisibilityTimeout":         "60", // far beyond this test: no redelivery
		},
	})
	if err != nil {
		t.Fatalf("create FIFO queue: %v", err)
	}
	q := created.QueueUrl

	send := func(group, body string) {
		t.Helper()
		if _, err := client.SendMessage(ctx, &sqs.SendMessageInput{
			QueueUrl:               q,
			MessageBody:            aws.String(body),
			MessageGroupId:         aws.String(group),
			MessageDeduplicationId: aws.String(body),
		}); err != nil {
			t.Fatalf("send %s: %v", body, err)
		}
	}
	send("g1", "g1-first")
	send("g1", "g1-second")
	send("g2", "g2-first")

	receiveOne := func() *types.Message {
		t.Helper()
		out, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:                    q,
			MaxNumberOfMessages:         1,
			WaitTimeSeconds:             1,
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameMessageGroupId},
		})
		if err != nil {
			t.Fatalf("receive: %v", err)
		}
		if len(out.Messages) == 0 {
			return nil
		}
		return &out.Messages[0]
	}
	body := func(m *types.Message) string {
		if m == nil {
			return "<none>"
		}
		return aws.ToString(m.Body)
	}

	first := receiveOne()
	if body(first) != "g1-first" {
		t.Fatalf("first receive: got %s, want g1-first", body(first))
	}
	// g1-first is in flight: g1 is blocked, g2 is not.
	second := receiveOne()
	if body(second) != "g2-first" {
		t.Fatalf("second receive while g1-first is in flight: got %s, want g2-first (g1-second must wait)", body(second))
	}
	// Nothing else may be delivered: g1-second waits for g1-first, g2 is in flight.
	if m := receiveOne(); m != nil {
		t.Fatalf("third receive while both groups are in flight: got %s, want nothing", body(m))
	}
	// Deleting g1-first releases g1-second.
	if _, err := client.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: q, ReceiptHandle: first.ReceiptHandle}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if m := receiveOne(); body(m) != "g1-second" {
		t.Fatalf("receive after deleting g1-first: got %s, want g1-second", body(m))
	}
	if _, err := client.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: q}); err != nil {
		t.Errorf("delete queue: %v", err)
	}
}
