package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/keyorder/keyorder"
)

// A command that fails because nothing answers at the broker's address
// says so, naming the backend and the address: "no Kafka broker answered
// at 127.0.0.1:9092 within 30s (connection refused)", where most clients
// alone say "context deadline exceeded" (they retry until the --timeout
// passes) and the others bury a dial error in a retry report.
//
// The command cannot tell from the clients' errors whether a broker was
// reached: after a failure that may be one (the --timeout passed, the
// backend is unavailable, a dial failed), it dials the addresses the URL
// names itself. Only when none accepts a TCP connection is the failure
// put down to the broker; a broker that accepts connections and is slow
// keeps the plain timeout message.

// probeTimeout bounds each dial of the probe.
const probeTimeout = 2 * time.Second

// endpoint is what a URL names as its broker: a description ("Kafka
// broker") and the addresses (host:port) to dial.
type endpoint struct {
	what  string
	addrs []string
}

// endpointOf returns the broker addresses of raw's scheme, or false when
// the URL does not name them (an SQS URL without endpoint=: the AWS
// endpoint of the configured region).
func endpointOf(raw string) (endpoint, bool) {
	u, err := url.Parse(raw)
	if err != nil {
		return endpoint{}, false
	}
	hosts := func(def string) []string {
		var out []string
		for _, h := range strings.Split(u.Host, ",") {
			if h == "" {
				continue
			}
			if _, _, err := net.SplitHostPort(h); err != nil {
				h = net.JoinHostPort(strings.Trim(h, "[]"), def)
			}
			out = append(out, h)
		}
		return out
	}
	var e endpoint
	switch strings.ToLower(u.Scheme) {
	case "postgres", "postgresql":
		e = endpoint{"PostgreSQL server", hosts("5432")}
	case "kafka":
		e = endpoint{"Kafka broker", hosts("9092")}
	case "nats":
		e = endpoint{"NATS server", hosts("4222")}
	case "pulsar":
		e = endpoint{"Pulsar broker", hosts("6650")}
	case "pulsar+ssl":
		e = endpoint{"Pulsar broker", hosts("6651")}
	case "sqs":
		ep, err := url.Parse(u.Query().Get("endpoint"))
		if err != nil || ep.Host == "" {
			return endpoint{}, false
		}
		port := "80"
		if ep.Scheme == "https" {
			port = "443"
		}
		e = endpoint{"SQS endpoint", []string{hostPort(ep.Host, port)}}
	case "pubsub":
		if h := os.Getenv("PUBSUB_EMULATOR_HOST"); h != "" {
			e = endpoint{"Pub/Sub emulator", []string{hostPort(h, "8085")}}
		} else {
			e = endpoint{"Pub/Sub endpoint", []string{"pubsub.googleapis.com:443"}}
		}
	default:
		return endpoint{}, false
	}
	return e, len(e.addrs) > 0
}

func hostPort(h, def string) string {
	if _, _, err := net.SplitHostPort(h); err == nil {
		return h
	}
	return net.JoinHostPort(strings.Trim(h, "[]"), def)
}

// mayBeUnreachable reports whether err may come from a broker that did
// not answer: the --timeout passed, the backend reported itself
// unavailable, or a dial failed.
func mayBeUnreachable(cmdCtx context.Context, err error) bool {
	var te *timeoutError
	if cmdCtx != nil && errors.As(context.Cause(cmdCtx), &te) {
		return true
	}
	if errors.Is(err, keyorder.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	m := err.Error()
	return strings.Contains(m, "connection refused") || strings.Contains(m, "no such host") || strings.Contains(m, "i/o timeout")
}

// unreachableError is a command's failure put down to a broker that did
// not answer at any of its addresses.
type unreachableError struct {
	what   string
	addrs  []string
	within time.Duration // the --timeout that passed; 0 when it did not
	dial   string        // why the probe's dial failed
	err    error
}

func (e *unreachableError) Error() string {
	s := fmt.Sprintf("no %s answered at %s", e.what, strings.Join(e.addrs, ", "))
	if e.within > 0 {
		s += fmt.Sprintf(" within %s", e.within)
	}
	return s + fmt.Sprintf(" (%s): %v", e.dial, e.err)
}

func (e *unreachableError) Unwrap() error { return e.err }

// unreachable returns err as an unreachableError when it may come from a
// broker that did not answer and no address of raw accepts a TCP
// connection; otherwise err. ctx bounds the probe (the interrupt's
// context, not the command's, which may have passed its deadline).
func (c *cli) unreachable(ctx context.Context, raw string, err error) error {
	if err == nil || raw == "" || !mayBeUnreachable(c.cmdCtx, err) {
		return err
	}
	var ue *usageError
	if errors.As(err, &ue) || errors.Is(err, keyorder.ErrBadURL) || errors.Is(err, keyorder.ErrNotFound) || errors.Is(err, keyorder.ErrUnsupported) {
		return err
	}
	e, ok := endpointOf(raw)
	if !ok {
		return err
	}
	why := ""
	for _, a := range e.addrs {
		dctx, cancel := context.WithTimeout(ctx, probeTimeout)
		conn, derr := (&net.Dialer{}).DialContext(dctx, "tcp", a)
		cancel()
		if derr == nil {
			conn.Close()
			return err // something listens there: not the broker's absence
		}
		if why == "" {
			why = dialReason(derr)
		}
	}
	ur := &unreachableError{what: e.what, addrs: e.addrs, dial: why, err: err}
	var te *timeoutError
	if c.cmdCtx != nil && errors.As(context.Cause(c.cmdCtx), &te) {
		ur.within = te.d
		// The timeout is said by "within"; keep the client's own error.
		ur.err = stripTimeout(err)
	}
	return ur
}

// stripTimeout returns the error timedOut wrapped, when it did.
func stripTimeout(err error) error {
	var te *timeoutError
	if !errors.As(err, &te) {
		return err
	}
	if w, ok := err.(interface{ Unwrap() []error }); ok {
		errs := w.Unwrap()
		if len(errs) == 2 {
			if _, ok := errs[0].(*timeoutError); ok {
				return errs[1]
			}
		}
	}
	return err
}

// dialReason is a dial error in a few words.
func dialReason(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("no TCP connection within %s", probeTimeout)
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return "host not found: " + dnsErr.Name
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Err.Error()
	}
	return err.Error()
}
