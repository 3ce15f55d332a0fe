package nats

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

var urlParams = []string{"subscription", "ordering", "lease", "max_batch", "max_pending", "create", "partitions", "msg_id"}

// connectBound bounds the URL opener's connection attempts when the
// context has none.
const connectBound = 30 * time.Second

// subOnly are the parameters a topic URL may not carry.
var subOnly = map[string]bool{"subscription": true, "ordering": true, "lease": true, "max_batch": true, "max_pending": true}

// URLOpener opens nats:// URLs (see the package documentation).
type URLOpener struct{}

func init() {
	driver.RegisterParams(Scheme, driver.Params{Names: urlParams})
	driver.DefaultMux().RegisterTopic(Scheme, &URLOpener{})
	driver.DefaultMux().RegisterSubscription(Scheme, &URLOpener{})
}

type parsed struct {
	topicO     TopicOptions
	server     string
	stream     string
	sub        string
	subO       SubscriptionOptions
	create     bool
	partitions int
}

func parseURL(u *url.URL, forSub bool) (*parsed, error) {
	if u.User != nil {
		return nil, driver.BadParam(u, "userinfo", "credentials in the URL are not supported; use the typed constructors with a connection of your own")
	}
	if u.Host == "" {
		return nil, driver.BadParam(u, "host", "missing server (nats://host:4222/STREAM)")
	}
	p := &parsed{server: "nats://" + u.Host}
	p.stream = u.Path
	if len(p.stream) > 0 && p.stream[0] == '/' {
		p.stream = p.stream[1:]
	}
	if !validName.MatchString(p.stream) {
		return nil, driver.BadParam(u, "path", "want /STREAM (letters, digits, '_' or '-')")
	}
	ps, err := driver.Query(u)
	if err != nil {
		return nil, err
	}
	for _, pv := range ps {
		name, v := pv.Name, pv.Value
		if !forSub && subOnly[name] {
			return nil, driver.BadParam(u, name, "a subscription parameter on a topic URL")
		}
		if forSub && name == "msg_id" {
			return nil, driver.BadParam(u, name, "a topic parameter on a subscription URL")
		}
		var perr error
		positive := func() int {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				perr = errors.New("want a positive integer")
			}
			return n
		}
		switch name {
		case "subscription":
			p.sub = v
			if !validName.MatchString(v) {
				perr = errors.New("want letters, digits, '_' or '-'")
			}
		case "ordering":
			p.subO.Ordering, perr = policy.ParseOrdering(v)
		case "lease":
			p.subO.Lease, perr = time.ParseDuration(v)
			if perr == nil && p.subO.Lease < time.Second {
				perr = errors.New("want a duration of at least 1s")
			}
		case "max_batch":
			p.subO.MaxBatch = positive()
		case "max_pending":
			p.subO.MaxPending = positive()
		case "msg_id":
			switch v {
			case "on", "true":
			case "off", "false":
				p.topicO.NoMsgID = true
			default:
				perr = errors.New("want on (default: Nats-Msg-Id for the stream's duplicate window) or off")
			}
		case "create":
			p.create, perr = strconv.ParseBool(v)
		case "partitions":
			p.partitions = positive()
			if perr == nil && p.partitions > 4096 {
				perr = errors.New("want at most 4096")
			}
		default:
			perr = errors.New("unknown parameter")
		}
		if perr != nil {
			return nil, driver.BadParam(u, name, perr.Error())
		}
	}
	if forSub && p.sub == "" {
		return nil, driver.BadParam(u, "subscription", "required to subscribe")
	}
	return p, nil
}

func (p *parsed) connect(ctx context.Context) (*nats.Conn, jetstream.JetStream, error) {
	// nats.Connect takes no context: it runs beside the wait for ctx, and a
	// connection that arrives after ctx ended is closed.
	type result struct {
		nc  *nats.Conn
		err error
	}
	ch := make(chan result, 1)
	// A server that is not there yet is retried until ctx ends, or for
	// connectBound when ctx has no deadline.
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, connectBound)
		defer cancel()
	}
	var nc *nats.Conn
	for nc == nil {
		go func() {
			nc, err := nats.Connect(p.server, nats.Name("keyorder"))
			ch <- result{nc, err}
		}()
		select {
		case r := <-ch:
			if r.err == nil {
				nc = r.nc
				continue
			}
			if !errors.Is(r.err, nats.ErrNoServers) {
				return nil, nil, fmt.Errorf("nats: connect %s: %w", p.server, r.err)
			}
			select {
			case <-time.After(250 * time.Millisecond):
			case <-ctx.Done():
				return nil, nil, fmt.Errorf("nats: connect %s: %w (last: %v)", p.server, ctx.Err(), r.err)
			}
		case <-ctx.Done():
			go func() {
				if r := <-ch; r.nc != nil {
					r.nc.Close()
				}
			}()
			return nil, nil, fmt.Errorf("nats: connect %s: %w", p.server, ctx.Err())
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("nats: jetstream: %w", err)
	}
	if p.create {
		if _, err := EnsureStream(ctx, js, p.stream, p.partitions); err != nil {
			nc.Close()
			return nil, nil, err
		}
	}
	return nc, js, nil
}

// OpenTopicURL opens nats://host:port/STREAM for publishing.
func (o *URLOpener) OpenTopicURL(ctx context.Context, u *url.URL) (driver.Topic, error) {
	p, err := parseURL(u, false)
	if err != nil {
		return nil, err
	}
	nc, js, err := p.connect(ctx)
	if err != nil {
		return nil, err
	}
	t, err := openTopic(ctx, js, p.stream, &p.topicO)
	if err != nil {
		nc.Close()
		return nil, err
	}
	t.ownConn = nc
	return t, nil
}

// OpenSubscriptionURL opens nats://host:port/STREAM?subscription=s.
func (o *URLOpener) OpenSubscriptionURL(ctx context.Context, u *url.URL) (driver.Subscription, error) {
	p, err := parseURL(u, true)
	if err != nil {
		return nil, err
	}
	nc, js, err := p.connect(ctx)
	if err != nil {
		return nil, err
	}
	s, err := openSubscription(ctx, js, p.stream, p.sub, &p.subO)
	if err != nil {
		nc.Close()
		return nil, err
	}
	s.ownConn = true
	return s, nil
}

// ErrorCode classifies the opener's errors.
func (o *URLOpener) ErrorCode(err error) keyorder.ErrorCode {
	if errors.Is(err, keyorder.ErrInvalidConfig) {
		return keyorder.CodeInvalidArgument
	}
	return errorCode(err)
}
