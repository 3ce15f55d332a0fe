package sqs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// URLOpener opens sqs:// URLs. Each URL opened gets its own client, built
// from the SDK's default configuration chain with the URL's endpoint,
// region and profile (see the package documentation).
//
// The client keeps the SDK's standard retryer (up to 3 attempts with
// backoff on throttling, 5xx and network errors) without its client-side
// retry quota, because every call the
// driver makes is safe to repeat: a SendMessageBatch or SendMessage
// repeated with the same MessageDeduplicationId is dropped by the FIFO
// queue within its 5-minute deduplication window (publishes, requeues,
// dead letters, redrives and the dead-letter walk's copies all carry one);
// DeleteMessage(Batch) and ChangeMessageVisibility(Batch) set the same end
// state twice; a ReceiveMessage repeated with the same
// ReceiveRequestAttemptId (Receive sets one per call) returns the same
// messages rather than leaving the first answer's invisible. The portable
// layer retries on top, with its own backoff, what the SDK gave up on.
type URLOpener struct {
	// Logger becomes the Options.Logger of the drivers it opens. Defaults
	// to slog.Default().
	Logger *slog.Logger
}

func init() {
	driver.RegisterParams(Scheme, driver.Params{
		Names:      []string{"endpoint", "region", "profile", "ordering", "lease", "wait", "oldest_first", "subscription"},
		Deprecated: map[string]string{"visibility": "lease", "oldestfirst": "oldest_first"},
	})
	driver.DefaultMux().RegisterTopic(Scheme, &URLOpener{})
	driver.DefaultMux().RegisterSubscription(Scheme, &URLOpener{})
}

// urlConfig is a parsed sqs:// URL.
type urlConfig struct {
	queue    string
	endpoint string
	region   string
	profile  string
	opts     Options
}

func parseURL(u *url.URL) (*urlConfig, error) {
	c := &urlConfig{queue: u.Host}
	c.opts.Ordering = policy.Ordered
	if c.queue == "" || (u.Path != "" && u.Path != "/") || u.User != nil || u.Opaque != "" {
		return nil, driver.BadParam(u, "host", "want one queue name (sqs://QUEUE-NAME.fifo)")
	}
	if _, err := deadQueueName(c.queue); err != nil {
		return nil, driver.BadParam(u, "host", err.Error())
	}
	ps, err := driver.Query(u)
	if err != nil {
		return nil, err
	}
	for _, kv := range ps {
		p, v := kv.Name, kv.Value
		var perr error
		switch p {
		case "endpoint":
			if eu, err := url.Parse(v); err != nil || eu.Scheme == "" || eu.Host == "" {
				perr = errors.New("want an absolute URL like http://127.0.0.1:9324")
			}
			c.endpoint = v
		case "region":
			if v == "" {
				perr = errors.New("empty")
			}
			c.region = v
		case "profile":
			if v == "" {
				perr = errors.New("empty")
			}
			c.profile = v
		case "ordering":
			c.opts.Ordering, perr = policy.ParseOrdering(v)
		case "lease":
			c.opts.Lease, perr = time.ParseDuration(v)
			if perr == nil && (c.opts.Lease < time.Second || c.opts.Lease > MaxVisibility) {
				perr = fmt.Errorf("want a duration from 1s to %v", MaxVisibility)
			}
		case "wait":
			c.opts.WaitTime, perr = time.ParseDuration(v)
			if perr == nil && (c.opts.WaitTime < 0 || c.opts.WaitTime > 20*time.Second) {
				perr = errors.New("want a duration from 0s to 20s")
			}
			if perr == nil && c.opts.WaitTime == 0 {
				c.opts.WaitTime = -1
			}
		case "oldest_first":
			c.opts.OldestFirst, perr = strconv.ParseBool(v)
		case "subscription":
			if v != c.queue {
				perr = fmt.Errorf("an SQS queue is its own subscription: want %q or no parameter", c.queue)
			}
		default:
			perr = errors.New("unknown parameter")
		}
		if perr != nil {
			return nil, driver.BadParam(u, p, perr.Error())
		}
	}
	return c, nil
}

// client builds the URL's client from the SDK's default configuration chain
// with the URL's region, profile and endpoint, and the SDK's retryer (see
// URLOpener).
func (c *urlConfig) client(ctx context.Context, u *url.URL) (*sqs.Client, error) {
	lo := []func(*config.LoadOptions) error{config.WithHTTPClient(NewHTTPClient())}
	if c.region != "" {
		lo = append(lo, config.WithRegion(c.region))
	}
	if c.profile != "" {
		lo = append(lo, config.WithSharedConfigProfile(c.profile))
	}
	cfg, err := config.LoadDefaultConfig(ctx, lo...)
	if err != nil {
		return nil, driver.BadParam(u, "profile", "loading the AWS configuration: "+err.Error())
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	return sqs.NewFromConfig(cfg, func(o *sqs.Options) {
		if c.endpoint != "" {
			o.BaseEndpoint = aws.String(c.endpoint)
		}
		// No client-side retry quota: the SDK's default retryer fails
		// calls at their first attempt once a client-wide token bucket of
		// retries is empty ("retry quota exceeded"), which turned a burst
		// of connection resets (ElasticMQ under load) into publish errors;
		// the portable layer bounds retries itself.
		o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) { so.RateLimiter = ratelimit.None })
	}), nil
}

// OpenTopicURL opens sqs://QUEUE.fifo?..., creating the queue if needed.
func (o *URLOpener) OpenTopicURL(ctx context.Context, u *url.URL) (driver.Topic, error) {
	c, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	c.opts.Logger = o.Logger
	client, err := c.client(ctx, u)
	if err != nil {
		return nil, err
	}
	qurl, err := CreateQueue(ctx, client, c.queue, &c.opts)
	if err != nil {
		return nil, err
	}
	return openTopic(ctx, client, qurl, &c.opts)
}

// OpenSubscriptionURL opens sqs://QUEUE.fifo?..., creating the queue if
// needed.
func (o *URLOpener) OpenSubscriptionURL(ctx context.Context, u *url.URL) (driver.Subscription, error) {
	c, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	c.opts.Logger = o.Logger
	client, err := c.client(ctx, u)
	if err != nil {
		return nil, err
	}
	qurl, err := CreateQueue(ctx, client, c.queue, &c.opts)
	if err != nil {
		return nil, err
	}
	s, err := openSubscription(ctx, client, qurl, &c.opts)
	if err != nil {
		return nil, err
	}
	return s.portable(), nil
}

// queueNameOf returns the last path element of a queue URL.
func queueNameOf(queueURL string) string {
	return queueURL[strings.LastIndexByte(queueURL, '/')+1:]
}

// ErrorCode classifies the errors of the opener (driver.ErrorCoder).
func (o *URLOpener) ErrorCode(err error) keyorder.ErrorCode { return errorCode(err) }
