package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/keyorder/keyorder/adapters/sqs"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// SQS settings shared by both sides.
const (
	sqsSenders   = 32 // goroutines sending (raw: each owns a share of the groups)
	sqsReceivers = 16 // raw: goroutines receiving
)

// rawAttrs adds a raw system that sends the message attributes keyorder's
// topic driver sends (keyorder-id, keyorder-key, keyorder-encoding) and a
// keyorder-like deduplication ID, and receives them back
// (MessageAttributeNames All), to measure what the attributes cost the
// broker apart from the rest of keyorder.
var rawAttrs = flag.Bool("raw-attrs", false, "sqs: also run the raw client sending and receiving keyorder's message attributes (nats always runs its raw client sending a Nats-Msg-Id per message)")

// rawKoReceive adds a raw system that also receives with the parameters
// keyorder's driver sends on every ReceiveMessage call (a
// ReceiveRequestAttemptId, its six system attribute names, a
// VisibilityTimeout), to measure what they cost the broker apart from
// keyorder's call pattern.
var rawKoReceive = flag.Bool("raw-ko-receive", false, "sqs: also run the raw client with keyorder's attributes and keyorder's ReceiveMessage parameters")

func sqsBackend(context.Context) (*backend, error) {
	sqsURL, err := env("KEYORDER_SQS_ENDPOINT", "sqs")
	if err != nil {
		return nil, err
	}
	var httpClient aws.HTTPClient = sqs.NewHTTPClient()
	var counts *sqsStats
	if *rpcs {
		counts = newSQSStats(httpClient)
		httpClient = counts
	}
	client := awssqs.New(awssqs.Options{
		BaseEndpoint: aws.String(sqsURL),
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		// Both sides use the HTTP client the URL opener builds (idle
		// connections for a thousand keys in flight; the SDK's default
		// keeps 10 and opens and closes the rest, which ElasticMQ
		// answered with connection resets under load) and no client-side
		// retry quota (which turned those resets into failed runs).
		HTTPClient: httpClient,
		Retryer:    retry.NewStandard(func(o *retry.StandardOptions) { o.RateLimiter = ratelimit.None }),
	})
	opts := &sqs.Options{Ordering: policy.Ordered, WaitTime: time.Second, Logger: quiet()}
	factory := func(opts *sqs.Options) koFactory {
		return func(ctx context.Context, id string) (*koDriver, error) {
			u, err := sqs.CreateQueue(ctx, client, id+".fifo", opts)
			if err != nil {
				return nil, err
			}
			return &koDriver{
				openPub: func(ctx context.Context, cfg *publish.Config) (*publish.Publisher, error) {
					return sqs.OpenTopic(ctx, client, u, opts, cfg)
				},
				openSub: func(ctx context.Context, cfg *subscribe.Config) (*subscribe.Subscriber, error) {
					return sqs.OpenSubscription(ctx, client, u, opts, cfg)
				},
				cleanup: func() { deleteQueues(client, id+".fifo", id+"-dead.fifo") },
			}, nil
		}
	}
	t := koTuning{
		subscribe:  subscribe.Config{Workers: 64},
		publishers: sqsSenders, chunk: 1000,
	}
	return &backend{
		name:  "sqs",
		title: "SQS FIFO (ElasticMQ)",
		note: fmt.Sprintf("Raw: aws-sdk-go-v2, payloads base64-encoded as keyorder sends a binary payload, SendMessageBatch of up to 10 messages of one group per call from %d goroutines (each owning a share of the groups), "+
			"%d goroutines calling ReceiveMessage (10, long poll 1s) and DeleteMessageBatch. "+
			"keyorder: Ordered, %s; PublishBatch from %d goroutines. The consumer receives up to 10 per ReceiveMessage call, chains of a group included, "+
			"and holds a chain whose member failed in process (the default, safe with any number of consuming processes); the OldestFirst row "+
			"also asks for 10 and hands out the oldest group heads first, putting back the surplus (one consuming process: see the sqs package documentation).", sqsSenders, sqsReceivers, lanesNote(64), sqsSenders),
		systems: append(rawSystems(client),
			append(koSystems(factory(opts), t), oldestFirstSystems(factory, opts, t)...)...),
		close: func() {},
		consumeStats: func(id string, n int) string {
			if counts == nil {
				return ""
			}
			return counts.consumeLine(id, n)
		},
	}, nil
}

// rawSystems returns the raw client and, with -raw-attrs, the raw client
// sending keyorder's attributes.
func rawSystems(client *awssqs.Client) []system {
	out := []system{{name: "raw aws-sdk-go-v2", ref: true,
		open: func(ctx context.Context, id string) (endpoint, error) { return openSQSRaw(ctx, client, id, false) }}}
	if *rawAttrs {
		out = append(out, system{name: "raw +keyorder attrs",
			open: func(ctx context.Context, id string) (endpoint, error) { return openSQSRaw(ctx, client, id, true) }})
	}
	if *rawKoReceive {
		out = append(out, system{name: "raw +keyorder attrs+receive",
			open: func(ctx context.Context, id string) (endpoint, error) {
				ep, err := openSQSRaw(ctx, client, id, true)
				if err == nil {
					ep.(*sqsRaw).koReceive = true
				}
				return ep, err
			}})
	}
	return out
}

// oldestFirstSystems returns keyorder PublishAsync with the consumer in
// Options.OldestFirst mode: each ReceiveMessage asks for 10 and the oldest
// group heads go first (the default asks for what the subscriber asks, up
// to 10, and takes SQS's choice; see the sqs package documentation for
// what OldestFirst costs).
func oldestFirstSystems(factory func(*sqs.Options) koFactory, opts *sqs.Options, t koTuning) []system {
	o := *opts
	o.OldestFirst = true
	var out []system
	for _, s := range koSystems(factory(&o), t) {
		if s.name == "keyorder "+modeAsync {
			s.name += " (OldestFirst)"
			out = append(out, s)
		}
	}
	return out
}

func deleteQueues(client *awssqs.Client, names ...string) {
	ctx := context.Background()
	for _, n := range names {
		if u, err := client.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(n)}); err == nil {
			_, _ = client.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: u.QueueUrl})
		}
	}
}

type sqsRaw struct {
	client *awssqs.Client
	name   string
	url    *string
	attrs  bool // send and receive keyorder's attributes (-raw-attrs)
	// koReceive: receive with keyorder's ReceiveMessage parameters
	// (-raw-ko-receive).
	koReceive bool
}

func openSQSRaw(ctx context.Context, client *awssqs.Client, id string, attrs bool) (endpoint, error) {
	out, err := client.CreateQueue(ctx, &awssqs.CreateQueueInput{
		QueueName: aws.String(id + ".fifo"),
		Attributes: map[string]string{
			"FifoQueue":                 "true",
			"ContentBasedDeduplication": "false",
			"VisibilityTimeout":         "30",
		},
	})
	if err != nil {
		return nil, err
	}
	return &sqsRaw{client: client, name: id + ".fifo", url: out.QueueUrl, attrs: attrs}, nil
}

func (e *sqsRaw) publish(ctx context.Context, w *workload) error {
	byKey := w.byKey()
	var wg sync.WaitGroup
	errs := make(chan error, sqsSenders)
	for s := range sqsSenders {
		wg.Go(func() {
			for k := s; k < len(byKey); k += sqsSenders {
				for chunk := range slices.Chunk(byKey[k], 10) {
					entries := make([]types.SendMessageBatchRequestEntry, len(chunk))
					for j, i := range chunk {
						id := strconv.Itoa(i)
						entries[j] = types.SendMessageBatchRequestEntry{
							Id: aws.String(id), MessageBody: aws.String(base64.StdEncoding.EncodeToString(w.payloads[i])),
							MessageGroupId: aws.String(w.key(i)), MessageDeduplicationId: aws.String(id),
						}
						if e.attrs {
							// What keyorder's encode sends for a message
							// with a key, no ID and a binary payload.
							var b [16]byte
							rand.Read(b[:])
							mid := base64.RawURLEncoding.EncodeToString(b[:])
							entries[j].MessageDeduplicationId = aws.String(mid)
							entries[j].MessageAttributes = map[string]types.MessageAttributeValue{
								sqs.AttrID:       {DataType: aws.String("String"), StringValue: aws.String(mid)},
								sqs.AttrKey:      {DataType: aws.String("String"), StringValue: aws.String(w.key(i))},
								sqs.AttrEncoding: {DataType: aws.String("String"), StringValue: aws.String("base64")},
							}
						}
					}
					out, err := e.client.SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{QueueUrl: e.url, Entries: entries})
					if err == nil && len(out.Failed) > 0 {
						err = fmt.Errorf("%d of %d entries failed: %s", len(out.Failed), len(entries), aws.ToString(out.Failed[0].Message))
					}
					if err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func (e *sqsRaw) consume(ctx context.Context, chk *orderCheck) error {
	var wg sync.WaitGroup
	errs := make(chan error, sqsReceivers)
	for range sqsReceivers {
		wg.Go(func() {
			for ctx.Err() == nil {
				in := &awssqs.ReceiveMessageInput{QueueUrl: e.url, MaxNumberOfMessages: 10, WaitTimeSeconds: 1}
				if e.attrs {
					in.MessageAttributeNames = []string{"All"}
				}
				if e.koReceive {
					// What the sqs driver's receiveRaw sends besides.
					var b [16]byte
					rand.Read(b[:])
					in.ReceiveRequestAttemptId = aws.String(base64.RawURLEncoding.EncodeToString(b[:]))
					in.VisibilityTimeout = int32(sqs.VisibilityDefault / time.Second)
					in.MessageSystemAttributeNames = []types.MessageSystemAttributeName{
						types.MessageSystemAttributeNameApproximateReceiveCount,
						types.MessageSystemAttributeNameSentTimestamp,
						types.MessageSystemAttributeNameMessageGroupId,
						types.MessageSystemAttributeNameSequenceNumber,
						types.MessageSystemAttributeNameApproximateFirstReceiveTimestamp,
						types.MessageSystemAttributeNameMessageDeduplicationId,
					}
				}
				out, err := e.client.ReceiveMessage(ctx, in)
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
				if len(out.Messages) == 0 {
					continue
				}
				entries := make([]types.DeleteMessageBatchRequestEntry, len(out.Messages))
				for j, m := range out.Messages {
					if p, err := base64.StdEncoding.DecodeString(aws.ToString(m.Body)); err == nil {
						chk.see(p)
					}
					entries[j] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(j)), ReceiptHandle: m.ReceiptHandle}
				}
				if _, err := e.client.DeleteMessageBatch(ctx, &awssqs.DeleteMessageBatchInput{QueueUrl: e.url, Entries: entries}); err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func (e *sqsRaw) close() { deleteQueues(e.client, e.name) }
