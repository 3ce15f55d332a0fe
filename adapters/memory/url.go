package memory

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// URLOpener opens mem:// URLs on its Broker.
type URLOpener struct {
	Broker *Broker
}

var defaultOpener = &URLOpener{Broker: NewBroker()}

func init() {
	driver.RegisterParams(Scheme, driver.Params{
		Names: []string{"payload", "max_key", "max_payload", "subscription", "ordering", "hold", "lease", "max_batch", "chain"},
		Deprecated: map[string]string{
			"maxkey": "max_key", "maxpayload": "max_payload", "maxbatch": "max_batch",
		},
	})
	driver.DefaultMux().RegisterTopic(Scheme, defaultOpener)
	driver.DefaultMux().RegisterSubscription(Scheme, defaultOpener)
}

// DefaultBroker returns the broker that mem:// URLs open.
func DefaultBroker() *Broker { return defaultOpener.Broker }

// topicName returns the topic a mem:// URL names: its host followed by its
// path, as written. A URL without a host (mem:/, mem:topic, mem:///x) names
// no topic.
func topicName(u *url.URL) (string, error) {
	if u.Host == "" || u.Opaque != "" || u.User != nil {
		return "", driver.BadURL(u, "missing topic name (want mem://topic)")
	}
	return u.Host + u.Path, nil
}

// OpenTopicURL opens mem://topic.
func (o *URLOpener) OpenTopicURL(_ context.Context, u *url.URL) (driver.Topic, error) {
	name, err := topicName(u)
	if err != nil {
		return nil, err
	}
	ps, err := driver.Query(u)
	if err != nil {
		return nil, err
	}
	var cfg TopicOptions
	for _, kv := range ps {
		p, v := kv.Name, kv.Value
		if p == "payload" {
			if v != "required" && v != "optional" {
				return nil, driver.BadParam(u, p, "want required or optional")
			}
			cfg.PayloadRequired = v == "required"
			continue
		}
		n, err := strconv.Atoi(v)
		switch {
		case p != "max_key" && p != "max_payload":
			return nil, driver.BadParam(u, p, "unknown parameter")
		case err != nil || n <= 0:
			return nil, driver.BadParam(u, p, "want a positive integer")
		case p == "max_key":
			cfg.MaxKeyBytes = n
		default:
			cfg.MaxPayloadBytes = n
		}
	}
	o.Broker.CreateTopic(name, &cfg)
	return o.Broker.newTopicDriver(name), nil
}

// OpenSubscriptionURL opens mem://topic?subscription=name&..., creating the
// subscription if it does not exist.
func (o *URLOpener) OpenSubscriptionURL(_ context.Context, u *url.URL) (driver.Subscription, error) {
	topicName, err := topicName(u)
	if err != nil {
		return nil, err
	}
	ps, err := driver.Query(u)
	if err != nil {
		return nil, err
	}
	cfg := SubscriptionOptions{Ordering: policy.Ordered}
	var name string
	for _, kv := range ps {
		p, v := kv.Name, kv.Value
		var err error
		switch p {
		case "subscription":
			name = v
		case "ordering":
			cfg.Ordering, err = policy.ParseOrdering(v)
		case "hold":
			switch v {
			case "native":
				cfg.Hold = Native
			case "inprocess":
				cfg.Hold = InProcess
			default:
				err = errors.New("want native or inprocess")
			}
		case "lease":
			cfg.Lease, err = time.ParseDuration(v)
			if err == nil && cfg.Lease <= 0 {
				err = errors.New("want a positive duration")
			}
		case "max_batch", "chain":
			var n int
			n, err = strconv.Atoi(v)
			if err == nil && n <= 0 {
				err = errors.New("want a positive integer")
			}
			if p == "max_batch" {
				cfg.MaxBatch = n
			} else {
				cfg.Chain = n
			}
		default:
			err = errors.New("unknown parameter")
		}
		if err != nil {
			return nil, driver.BadParam(u, p, err.Error())
		}
	}
	if name == "" {
		return nil, driver.BadParam(u, "subscription", "required")
	}
	if err := o.Broker.CreateSubscription(topicName, name, &cfg); err != nil {
		return nil, err
	}
	return o.Broker.newSubscriptionDriver(name)
}

// ErrorCode classifies the errors of the opener (driver.ErrorCoder).
func (o *URLOpener) ErrorCode(err error) keyorder.ErrorCode { return errorCode(err) }
