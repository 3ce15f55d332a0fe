package pubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// URLOpener opens pubsub:// URLs. Each URL opened gets its own client
// (gpubsub.NewClient for the URL's project), closed with the driver.
type URLOpener struct {
	// Logger is given to the drivers opened. Defaults to slog.Default().
	Logger *slog.Logger
}

func init() {
	driver.RegisterParams(Scheme, driver.Params{
		Names: []string{"subscription", "ordering", "lease", "max_batch", "max_attempts"},
		Deprecated: map[string]string{
			"ackdeadline": "lease", "maxbatch": "max_batch", "maxdeliveryattempts": "max_attempts",
		},
	})
	driver.DefaultMux().RegisterTopic(Scheme, &URLOpener{})
	driver.DefaultMux().RegisterSubscription(Scheme, &URLOpener{})
}

func projectAndTopic(u *url.URL) (string, string, error) {
	project, topic := u.Host, strings.TrimPrefix(u.Path, "/")
	if u.User != nil || u.Opaque != "" || u.Port() != "" {
		return "", "", driver.BadURL(u, "want pubsub://project/topic")
	}
	if project == "" {
		return "", "", driver.BadParam(u, "host", "missing project (pubsub://project/topic)")
	}
	if topic == "" || strings.Contains(topic, "/") {
		return "", "", driver.BadParam(u, "path", "want one topic ID (pubsub://project/topic)")
	}
	return project, topic, nil
}

// parseTopicURL reads pubsub://project/topic, which takes no parameter.
func parseTopicURL(u *url.URL) (project, topic string, err error) {
	project, topic, err = projectAndTopic(u)
	if err != nil {
		return "", "", err
	}
	ps, err := driver.Query(u)
	if err != nil {
		return "", "", err
	}
	for _, p := range ps {
		return "", "", driver.BadParam(u, p.Name, "unknown parameter (a topic URL takes none)")
	}
	return project, topic, nil
}

// withCtx returns err, also matching ctx's error when ctx ended: gRPC
// reports an ended context as a status (DeadlineExceeded, Canceled) that
// errors.Is does not match to context.DeadlineExceeded or
// context.Canceled.
func withCtx(ctx context.Context, err error) error {
	if cerr := ctx.Err(); err != nil && cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w (%w)", err, cerr)
	}
	return err
}

// OpenTopicURL opens pubsub://project/topic, creating the topic if needed.
func (o *URLOpener) OpenTopicURL(ctx context.Context, u *url.URL) (driver.Topic, error) {
	t, err := o.openTopicURL(ctx, u)
	if err != nil {
		return nil, withCtx(ctx, err)
	}
	return t, nil
}

func (o *URLOpener) openTopicURL(ctx context.Context, u *url.URL) (driver.Topic, error) {
	project, topic, err := parseTopicURL(u)
	if err != nil {
		return nil, err
	}
	client, err := gpubsub.NewClient(ctx, project)
	if err != nil {
		return nil, fmt.Errorf("pubsub: client for project %s: %w", project, err)
	}
	if err := CreateTopic(ctx, client, topic); err != nil {
		client.Close()
		return nil, err
	}
	t, err := openTopic(ctx, client, topic, &TopicOptions{Logger: o.Logger})
	if err != nil {
		client.Close()
		return nil, err
	}
	t.ownClient = true
	return t, nil
}

// parseSubscriptionURL maps the URL's parameters onto SubscriptionOptions.
func parseSubscriptionURL(u *url.URL) (project, topic, sub string, opts SubscriptionOptions, err error) {
	project, topic, err = projectAndTopic(u)
	if err != nil {
		return
	}
	opts.Ordering = policy.Ordered
	ps, err := driver.Query(u)
	if err != nil {
		return
	}
	for _, kv := range ps {
		p, v := kv.Name, kv.Value
		var perr error
		switch p {
		case "subscription":
			sub = v
			if v == "" || strings.Contains(v, "/") {
				perr = errors.New("want a subscription ID")
			}
		case "ordering":
			opts.Ordering, perr = policy.ParseOrdering(v)
		case "lease":
			opts.Lease, perr = time.ParseDuration(v)
			if perr == nil && (opts.Lease < MinAckDeadline || opts.Lease > MaxAckDeadline) {
				perr = fmt.Errorf("want a duration from %v to %v", MinAckDeadline, MaxAckDeadline)
			}
		case "max_batch", "max_attempts":
			var n int
			n, perr = strconv.Atoi(v)
			switch {
			case perr != nil || n <= 0:
				perr = errors.New("want a positive integer")
			case p == "max_batch":
				opts.MaxBatch = n
			case n < 5 || n > 100:
				perr = errors.New("want 5 to 100")
			default:
				opts.MaxDeliveryAttempts = n
			}
		default:
			perr = errors.New("unknown parameter")
		}
		if perr != nil {
			err = driver.BadParam(u, p, perr.Error())
			return
		}
	}
	if sub == "" {
		err = driver.BadParam(u, "subscription", "required")
	}
	return
}

// OpenSubscriptionURL opens pubsub://project/topic?subscription=name&...,
// creating the topic and the subscription if needed.
func (o *URLOpener) OpenSubscriptionURL(ctx context.Context, u *url.URL) (driver.Subscription, error) {
	s, err := o.openSubscriptionURL(ctx, u)
	if err != nil {
		return nil, withCtx(ctx, err)
	}
	return s, nil
}

func (o *URLOpener) openSubscriptionURL(ctx context.Context, u *url.URL) (driver.Subscription, error) {
	project, topic, sub, opts, err := parseSubscriptionURL(u)
	if err != nil {
		return nil, err
	}
	client, err := gpubsub.NewClient(ctx, project)
	if err != nil {
		return nil, fmt.Errorf("pubsub: client for project %s: %w", project, err)
	}
	opts.Logger = o.Logger
	// A creation failure is returned as it is: opening the subscription
	// after it would only report a misleading NotFound.
	err = CreateTopic(ctx, client, topic)
	if err == nil {
		err = CreateSubscription(ctx, client, topic, sub, &opts)
	}
	if err != nil {
		client.Close()
		return nil, err
	}
	s, err := openSubscription(ctx, client, sub, &opts)
	if err != nil {
		client.Close()
		return nil, err
	}
	s.ownClient = true
	return s.portable(), nil
}

// ErrorCode classifies the errors of the opener (driver.ErrorCoder).
func (o *URLOpener) ErrorCode(err error) keyorder.ErrorCode { return errorCode(err) }
