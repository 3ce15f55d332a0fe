package sqs_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/sqs"
	"github.com/keyorder/keyorder/internal/testenv"
	"github.com/keyorder/keyorder/publish"
)

// TestAsyncPublishVsRaw measures, on ElasticMQ, N messages of 100 B over
// 200 keys published by the raw aws-sdk-go-v2 client (SendMessageBatch of
// up to 10 messages of one group per call, 32 goroutines each owning a
// share of the groups, so each group's batches go in order) and by
// keyorder's PublishAsync from one goroutine through the URL opener (its
// HTTP client included; then every Result's Get), in alternating rounds,
// and logs the medians and their ratio. It runs when KEYORDER_ASYNC_BENCH
// is set to N (the workload is 20000); rounds from
// KEYORDER_ASYNC_ROUNDS (default 3).
func TestAsyncPublishVsRaw(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KEYORDER_ASYNC_BENCH"))
	if n <= 0 {
		t.Skip("set KEYORDER_ASYNC_BENCH=N to measure")
	}
	rounds, _ := strconv.Atoi(os.Getenv("KEYORDER_ASYNC_ROUNDS"))
	rounds = max(rounds, 1)
	endpoint := testenv.Require(t, testenv.SQS)
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	client := awssqs.New(awssqs.Options{
		BaseEndpoint: aws.String(endpoint),
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		HTTPClient:   sqs.NewHTTPClient(),
	})
	ctx := context.Background()
	const keys, senders = 200, 32
	payload := make([]byte, 100)
	key := func(i int) string { return fmt.Sprintf("key-%03d", i%keys) }
	raw := func() float64 {
		name := uniqueQueue("rawbench")
		out, err := client.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(name),
			Attributes: map[string]string{"FifoQueue": "true", "ContentBasedDeduplication": "false"}})
		if err != nil {
			t.Fatal(err)
		}
		defer client.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: out.QueueUrl})
		body := base64.StdEncoding.EncodeToString(payload) // as keyorder sends a binary payload
		var wg sync.WaitGroup
		start := time.Now()
		for s := range senders {
			wg.Go(func() {
				for k := s; k < keys; k += senders {
					var mine []int
					for i := k; i < n; i += keys {
						mine = append(mine, i)
					}
					for chunk := range slices.Chunk(mine, 10) {
						entries := make([]types.SendMessageBatchRequestEntry, len(chunk))
						for j, i := range chunk {
							id := strconv.Itoa(i)
							entries[j] = types.SendMessageBatchRequestEntry{Id: aws.String(id), MessageBody: aws.String(body),
								MessageGroupId: aws.String(key(i)), MessageDeduplicationId: aws.String(id)}
						}
						res, err := client.SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{QueueUrl: out.QueueUrl, Entries: entries})
						if err == nil && len(res.Failed) > 0 {
							err = fmt.Errorf("%d entries failed", len(res.Failed))
						}
						if err != nil {
							t.Error(err)
							return
						}
					}
				}
			})
		}
		wg.Wait()
		return float64(n) / time.Since(start).Seconds()
	}
	ours := func() float64 {
		name := uniqueQueue("kobench")
		p, err := publish.Open(ctx, "sqs://"+name+"?region=us-east-1&endpoint="+endpoint,
			&publish.Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			p.Close(ctx)
			if u, err := client.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(name)}); err == nil {
				deleteQueues(client, *u.QueueUrl)
			}
		}()
		rs := make([]*publish.Result, n)
		start := time.Now()
		for i := range n {
			rs[i] = p.PublishAsync(ctx, &keyorder.Message{Key: key(i), Payload: payload})
		}
		for _, r := range rs {
			if _, err := r.Get(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return float64(n) / time.Since(start).Seconds()
	}
	var rawRates, ourRates []float64
	for r := range rounds {
		rawRates = append(rawRates, raw())
		ourRates = append(ourRates, ours())
		t.Logf("round %d: raw %.0f msgs/s, keyorder PublishAsync %.0f msgs/s", r+1, rawRates[r], ourRates[r])
	}
	rm, om := median(rawRates), median(ourRates)
	t.Logf("ElasticMQ, %d x 100 B over %d keys, median of %d: raw (SendMessageBatch, %d goroutines) %.0f msgs/s, keyorder PublishAsync (one goroutine) %.0f msgs/s, ratio %.2fx",
		n, keys, rounds, senders, rm, om, om/rm)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
