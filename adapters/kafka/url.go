package kafka

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// urlParams are the parameters of a kafka URL.
var urlParams = []string{
	"group", "ordering", "lease", "session_timeout", "max_batch", "max_pending", "max_message_size", "client_id",
	"create", "partitions",
}

// subOnly are the parameters only a subscription URL may carry.
var subOnly = map[string]bool{
	"group": true, "ordering": true, "lease": true, "session_timeout": true, "max_batch": true, "max_pending": true,
}

// URLOpener opens kafka:// URLs. Each URL opened gets its own clients,
// closed with the driver.
type URLOpener struct{}

func init() {
	driver.RegisterParams(Scheme, driver.Params{Names: urlParams})
	driver.DefaultMux().RegisterTopic(Scheme, &URLOpener{})
	driver.DefaultMux().RegisterSubscription(Scheme, &URLOpener{})
}

// parsed is a kafka URL's meaning.
type parsed struct {
	brokers []string
	topic   string
	group   string
	client  []kgo.Opt
	topicO  TopicOptions
	subO    SubscriptionOptions
	// create asks the opener to create the topic when it does not exist,
	// with partitions partitions (-1: the broker's num.partitions).
	create     bool
	partitions int32
}

// parseURL reads kafka://host:port[,host:port...]/topic?params.
func parseURL(u *url.URL, forSub bool) (*parsed, error) {
	if u.User != nil {
		return nil, driver.BadParam(u, "userinfo", "credentials in the URL are not supported; use the typed constructors with SASL options")
	}
	p := &parsed{}
	if u.Host == "" {
		return nil, driver.BadParam(u, "host", "missing broker (kafka://host:9092/topic)")
	}
	for _, b := range strings.Split(u.Host, ",") {
		host, port, ok := strings.Cut(b, ":")
		if !ok || host == "" {
			return nil, driver.BadParam(u, "host", "want host:port, comma-separated")
		}
		if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
			return nil, driver.BadParam(u, "host", "want host:port with a port number")
		}
		p.brokers = append(p.brokers, b)
	}
	p.topic = strings.Trim(u.Path, "/")
	if p.topic == "" || strings.Contains(p.topic, "/") || !validTopic(p.topic) {
		return nil, driver.BadParam(u, "path", "want /topic (letters, digits, '.', '_', '-'; at most 249)")
	}
	p.subO.Ordering = policy.Ordered
	ps, err := driver.Query(u)
	if err != nil {
		return nil, err
	}
	clientID := ""
	p.partitions = -1
	partitionsSet := false
	for _, pv := range ps {
		name, v := pv.Name, pv.Value
		var perr error
		positive := func() int {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				perr = errors.New("want a positive integer")
			}
			return n
		}
		switch name {
		case "group":
			p.group = v
			if v == "" {
				perr = errors.New("want a consumer group name")
			}
		case "ordering":
			p.subO.Ordering, perr = policy.ParseOrdering(v)
		case "lease":
			p.subO.Lease, perr = time.ParseDuration(v)
			if perr == nil && p.subO.Lease < time.Second {
				perr = errors.New("want a duration of at least 1s")
			}
		case "session_timeout":
			p.subO.SessionTimeout, perr = time.ParseDuration(v)
			if perr == nil && p.subO.SessionTimeout < time.Second {
				perr = errors.New("want a duration of at least 1s")
			}
		case "max_batch":
			p.subO.MaxBatch = positive()
		case "max_pending":
			p.subO.MaxPending = positive()
		case "max_message_size":
			n := positive()
			if perr == nil && (n <= MetadataRoom || n > math.MaxInt32) {
				perr = fmt.Errorf("want a size in bytes above %d and at most %d", MetadataRoom, math.MaxInt32)
			}
			p.topicO.MaxMessageBytes, p.subO.MaxMessageBytes = n, n
		case "client_id":
			clientID = v
		case "create":
			p.create, perr = strconv.ParseBool(v)
		case "partitions":
			n := positive()
			if perr == nil && n > maxPartitions {
				perr = fmt.Errorf("want at most %d", maxPartitions)
			}
			p.partitions, partitionsSet = int32(n), true
		default:
			perr = errors.New("unknown parameter")
		}
		if perr == nil && subOnly[name] && !forSub {
			perr = errors.New("a subscription parameter on a topic URL")
		}
		if perr != nil {
			return nil, driver.BadParam(u, name, perr.Error())
		}
	}
	if forSub && p.group == "" {
		return nil, driver.BadParam(u, "group", "required")
	}
	if forSub && !validTopic(DeadLetterTopic(p.topic, p.group)) {
		return nil, driver.BadParam(u, "group", deadTopicRule)
	}
	if partitionsSet && !p.create {
		return nil, driver.BadParam(u, "partitions", "only with create=true (an existing topic keeps its partitions)")
	}
	p.client = []kgo.Opt{kgo.SeedBrokers(p.brokers...)}
	if clientID != "" {
		p.client = append(p.client, kgo.ClientID(clientID))
	}
	if n := p.topicO.MaxMessageBytes; n > MaxMessageBytesDefault {
		// franz-go refuses, before sending, a record above its batch
		// limit (1,000,012 bytes by default).
		p.client = append(p.client, kgo.ProducerBatchMaxBytes(int32(n)))
	}
	p.subO.ClientOptions = p.client
	return p, nil
}

// validTopic reports whether t is a legal Kafka topic name.
func validTopic(t string) bool {
	if len(t) > 249 || t == "." || t == ".." {
		return false
	}
	for _, r := range t {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// deadTopicRule is why a group is refused: its dead-letter topic,
// <topic>.<group>.dead, would not be a legal topic name, and no dead
// letter could be written (the broker refuses the topic, and the message
// would come back forever).
const deadTopicRule = "the dead-letter topic <topic>.<group>.dead must be a legal topic name: " +
	"the group of letters, digits, '.', '_', '-', and the whole at most 249 characters"

// maxPartitions bounds the partitions parameter (a typo guard, far above
// what one topic of a keyed workload needs).
const maxPartitions = 10000

// ensureTopic creates topic with partitions partitions (-1: the broker's
// default) and the broker's default replication factor unless it exists;
// with maxMessage > 0 (max_message_size) the topic it creates has that
// max.message.bytes. An existing topic is left as it is.
// It uses a client of its own, so that it works before the driver's
// clients exist.
func ensureTopic(ctx context.Context, opts []kgo.Opt, topic string, partitions int32, maxMessage int) error {
	var configs map[string]*string
	if maxMessage > 0 {
		v := strconv.Itoa(maxMessage)
		configs = map[string]*string{"max.message.bytes": &v}
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("%w: kafka: client: %v", keyorder.ErrInvalidConfig, err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		r, err := kadm.NewClient(cl).CreateTopic(ctx, partitions, -1, configs, topic)
		if err == nil {
			err = r.Err
		}
		if err == nil || errors.Is(err, kerr.TopicAlreadyExists) {
			return nil
		}
		if !isRetryable(err) || ctx.Err() != nil {
			return fmt.Errorf("kafka: create topic %s: %w", topic, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// connectTimeout bounds how long opening waits for a broker that does not
// answer (when the context has no earlier deadline).
const connectTimeout = 30 * time.Second

// unknownTopicWait is how long awaitTopic goes on asking after the cluster
// first answers that the topic does not exist: a topic created a moment
// ago (create=true, or by another client) takes a moment to reach every
// broker's metadata; a topic that does not exist is reported as such once
// this passes, not after connectTimeout.
const unknownTopicWait = 5 * time.Second

// awaitTopic waits until the cluster answers and reports topic, and
// returns its ID. It retries transient failures (a broker not up yet)
// until ctx ends or connectTimeout passes. A topic the cluster keeps
// reporting unknown for unknownTopicWait is an error matching
// keyorder.ErrNotFound (and kerr.UnknownTopicOrPartition).
func awaitTopic(ctx context.Context, cl *kgo.Client, topic string) ([16]byte, error) {
	var zero [16]byte
	deadline := time.Now().Add(connectTimeout)
	var unknownSince time.Time
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		tds, err := kadm.NewClient(cl).ListTopics(ctx, topic)
		if err == nil {
			if td, ok := tds[topic]; ok && td.Err == nil {
				return td.ID, nil
			} else if ok {
				err = td.Err
			}
		}
		if cerr := ctx.Err(); cerr != nil {
			return zero, fmt.Errorf("kafka: topic %s: %w", topic, cerr)
		}
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			if unknownSince.IsZero() {
				unknownSince = time.Now()
			} else if time.Since(unknownSince) >= unknownTopicWait {
				return zero, fmt.Errorf("%w: kafka: topic %s does not exist (create it, or open the URL with create=true): %w",
					keyorder.ErrNotFound, topic, err)
			}
		}
		if err != nil && !isRetryable(err) || time.Now().After(deadline) {
			if err == nil {
				err = errors.New("no answer")
			}
			return zero, fmt.Errorf("kafka: topic %s: %w", topic, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return zero, fmt.Errorf("kafka: topic %s: %w", topic, ctx.Err())
		case <-t.C:
		}
	}
}

// topicMaxMessageBytes returns the topic's max.message.bytes (its own, or
// the broker's message.max.bytes it inherits) when it is below
// MaxMessageBytesDefault and above MetadataRoom, so that a payload the
// broker would refuse fails before it is sent; 0 (the default) otherwise,
// or when the configuration cannot be read (no DescribeConfigs
// permission): then the broker's refusal is the error.
func topicMaxMessageBytes(ctx context.Context, cl *kgo.Client, topic string) int {
	rcs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return 0
	}
	rc, err := rcs.On(topic, nil)
	if err != nil || rc.Err != nil {
		return 0
	}
	for _, c := range rc.Configs {
		if c.Key != "max.message.bytes" || c.Value == nil {
			continue
		}
		if n, err := strconv.Atoi(*c.Value); err == nil && n > MetadataRoom && n < MaxMessageBytesDefault {
			return n
		}
	}
	return 0
}

// OpenTopicURL opens kafka://host:port/topic for publishing. The topic
// must exist (the opener waits for the cluster to report it), unless the
// URL says create=true.
func (o *URLOpener) OpenTopicURL(ctx context.Context, u *url.URL) (driver.Topic, error) {
	p, err := parseURL(u, false)
	if err != nil {
		return nil, err
	}
	if p.create {
		if err := ensureTopic(ctx, p.client, p.topic, p.partitions, p.topicO.MaxMessageBytes); err != nil {
			return nil, err
		}
	}
	// No linger: the publisher batches per key already (one batch in
	// flight, what queues behind it goes next); franz-go's 10ms default
	// would add 10ms to each key's round trip.
	cl, err := kgo.NewClient(append(p.client, kgo.DefaultProduceTopic(p.topic), kgo.ProducerLinger(0))...)
	if err != nil {
		return nil, fmt.Errorf("%w: kafka: client: %v", keyorder.ErrInvalidConfig, err)
	}
	if _, err := awaitTopic(ctx, cl, p.topic); err != nil {
		cl.Close()
		return nil, err
	}
	if p.topicO.MaxMessageBytes == 0 {
		p.topicO.MaxMessageBytes = topicMaxMessageBytes(ctx, cl, p.topic)
	}
	t, err := openTopic(ctx, cl, p.topic, &p.topicO)
	if err != nil {
		cl.Close()
		return nil, err
	}
	t.ownClient = true
	return t, nil
}

// OpenSubscriptionURL opens kafka://host:port/topic?group=g&...: a member
// of consumer group g on topic, which must exist unless the URL says
// create=true.
func (o *URLOpener) OpenSubscriptionURL(ctx context.Context, u *url.URL) (driver.Subscription, error) {
	p, err := parseURL(u, true)
	if err != nil {
		return nil, err
	}
	if p.create {
		if err := ensureTopic(ctx, p.client, p.topic, p.partitions, p.topicO.MaxMessageBytes); err != nil {
			return nil, err
		}
	}
	return openSubscription(ctx, p.topic, p.group, &p.subO)
}

// ErrorCode classifies the errors the opener returns, so the URL mux
// returns them as *keyorder.Error with the right code.
func (o *URLOpener) ErrorCode(err error) keyorder.ErrorCode { return errorCode(err) }
