package sqs_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go/middleware"

	"github.com/keyorder/keyorder/adapters/sqs"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// syncBuffer is a bytes.Buffer safe for a logger and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// failing returns an ElasticMQ client whose calls of operation op fail
// before they are sent (the failure is injected into the SDK's own
// middleware stack; every other call reaches the server).
func failing(t *testing.T, op string) *awssqs.Client {
	t.Helper()
	_, endpoint := newClient(t)
	fail := func(stack *middleware.Stack) error {
		return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("keyorder-fail", func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			if awsmiddleware.GetOperationName(ctx) == op {
				return middleware.InitializeOutput{}, middleware.Metadata{}, errors.New("injected failure")
			}
			return next.HandleInitialize(ctx, in)
		}), middleware.Before)
	}
	return awssqs.New(awssqs.Options{
		BaseEndpoint: aws.String(endpoint),
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		Retryer:      aws.NopRetryer{},
		APIOptions:   []func(*middleware.Stack) error{fail},
	})
}

// A not-before hold SQS refuses cannot be returned to anyone: the driver
// reports it to its injected logger.
func TestFailedHoldIsLogged(t *testing.T) {
	_, q, topic, _ := open(t, policy.Ordered, 30*time.Second)
	var logs syncBuffer
	sub, err := sqs.OpenSubscriptionDriver(t.Context(), failing(t, "ChangeMessageVisibility"), q, &sqs.Options{
		Ordering: policy.Ordered, WaitTime: time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := topic.SendBatch(t.Context(), []*driver.Message{{ID: "later", Key: "A", Payload: []byte("x"), NotBefore: time.Now().Add(time.Minute)}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if ms, _ := sub.Receive(ctx, 1); len(ms) != 0 {
		t.Fatalf("a message a minute early was handed out: %v", ms[0].ID)
	}
	if got := logs.String(); !strings.Contains(got, "level=WARN") || !strings.Contains(got, "not-before") || !strings.Contains(got, "injected failure") {
		t.Fatalf("the failed hold was not logged; log: %q", got)
	}
}
