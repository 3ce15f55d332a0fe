package sqs

import (
	"context"
	"net/url"

	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
)

// The drivers, for this package's tests: they exercise the driver contract
// directly (Receive, Ack, ...), which applications reach only through
// publish and subscribe.

// Topic is the topic driver.
type Topic = topicDriver

// Subscription is the subscription driver.
type Subscription = subscriptionDriver

// OpenTopicDriver opens the topic driver (see OpenTopic).
var OpenTopicDriver = openTopic

// OpenSubscriptionDriver opens the subscription driver (see
// OpenSubscription).
var OpenSubscriptionDriver = openSubscription

// URLClient returns the client the URL opener builds for u.
func URLClient(ctx context.Context, u *url.URL) (*awssqs.Client, error) {
	c, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	return c.client(ctx, u)
}
