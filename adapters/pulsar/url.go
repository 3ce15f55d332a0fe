package pulsar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	pulsarlog "github.com/apache/pulsar-client-go/pulsar/log"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// badParam is the error for an invalid or unknown parameter; the URL in it
// is redacted (userinfo password, token and other sensitive parameters).
func badParam(u *url.URL, param, why string) error {
	return driver.BadParam(u, param, why)
}

// queryOf reads u's parameters strictly (driver.Query: a malformed
// escape or a repeated parameter is ErrBadURL) into a map.
func queryOf(u *url.URL) (map[string]string, []driver.Param, error) {
	ps, err := driver.Query(u)
	if err != nil {
		return nil, nil, err
	}
	q := make(map[string]string, len(ps))
	for _, p := range ps {
		q[p.Name] = p.Value
	}
	return q, ps, nil
}

// topicOf maps pulsar://host:port/tenant/namespace/topic to
// persistent://tenant/namespace/topic.
func topicOf(u *url.URL) (string, error) {
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	if u.Host == "" {
		return "", badParam(u, "host", "missing broker host (pulsar://host:6650/tenant/namespace/topic)")
	}
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return "", badParam(u, "path", "want /tenant/namespace/topic")
	}
	return "persistent://" + strings.Join(parts, "/"), nil
}

// clientParams are the parameters every pulsar URL may carry.
func clientOptions(u *url.URL) (pulsar.ClientOptions, error) {
	co := pulsar.ClientOptions{
		URL:               u.Scheme + "://" + u.Host,
		OperationTimeout:  30 * time.Second,
		ConnectionTimeout: 10 * time.Second,
		// The client logs every connection and subscription at INFO.
		Logger: pulsarlog.NewLoggerWithSlog(slog.New(warnOnly{slog.Default().Handler()})),
	}
	q, ps, err := queryOf(u)
	if err != nil {
		return co, err
	}
	var certFile, keyFile string
	for _, pv := range ps {
		p, v := pv.Name, pv.Value
		var err error
		switch p {
		case "tls_ca_file":
			co.TLSTrustCertsFilePath = v
		case "tls_allow_insecure":
			co.TLSAllowInsecureConnection, err = strconv.ParseBool(v)
		case "tls_validate_hostname":
			co.TLSValidateHostname, err = strconv.ParseBool(v)
		case "tls_cert_file":
			certFile = v
		case "tls_key_file":
			keyFile = v
		case "token":
			co.Authentication = pulsar.NewAuthenticationToken(v)
		case "token_file":
			co.Authentication = pulsar.NewAuthenticationTokenFromFile(v)
		default:
			continue
		}
		if err != nil {
			return co, badParam(u, p, "want true or false")
		}
	}
	if (certFile == "") != (keyFile == "") {
		return co, badParam(u, "tls_cert_file", "tls_cert_file and tls_key_file go together")
	}
	if certFile != "" {
		co.Authentication = pulsar.NewAuthenticationTLS(certFile, keyFile)
	}
	_, hasToken := q["token"]
	_, hasTokenFile := q["token_file"]
	if hasToken && hasTokenFile {
		return co, badParam(u, "token", "give token or token_file, not both")
	}
	return co, nil
}

var clientParamNames = map[string]bool{
	"tls_ca_file": true, "tls_allow_insecure": true, "tls_validate_hostname": true,
	"tls_cert_file": true, "tls_key_file": true, "token": true, "token_file": true,
}

// urlParams are the parameters of a pulsar URL; deprecatedParams their old
// spellings, still accepted.
var (
	urlParams = []string{
		"tls_ca_file", "tls_allow_insecure", "tls_validate_hostname", "tls_cert_file", "tls_key_file", "token", "token_file",
		"admin", "batching", "max_message_size", "subscription", "ordering", "sticky", "receiver_queue", "max_batch", "lease",
		"run_record",
	}
	deprecatedParams = map[string]string{
		"tlscafile": "tls_ca_file", "tlsallowinsecure": "tls_allow_insecure", "tlsvalidatehostname": "tls_validate_hostname",
		"tlscertfile": "tls_cert_file", "tlskeyfile": "tls_key_file", "tokenfile": "token_file",
		"maxmessagesize": "max_message_size", "receiverqueue": "receiver_queue", "maxbatch": "max_batch",
	}
)

// URLOpener opens pulsar:// and pulsar+ssl:// URLs. Each URL opened gets
// its own client, closed with the driver.
type URLOpener struct{}

func init() {
	for _, s := range []string{Scheme, SchemeTLS} {
		driver.RegisterParams(s, driver.Params{Names: urlParams, Secret: []string{"token"}, Deprecated: deprecatedParams})
		driver.DefaultMux().RegisterTopic(s, &URLOpener{})
		driver.DefaultMux().RegisterSubscription(s, &URLOpener{})
	}
}

type parsed struct {
	topic  string
	sub    string
	client pulsar.ClientOptions
	topicO TopicOptions
	subO   SubscriptionOptions
	admin  string
}

func parseURL(u *url.URL, forSub bool) (*parsed, error) {
	topic, err := topicOf(u)
	if err != nil {
		return nil, err
	}
	p := &parsed{topic: topic}
	if p.client, err = clientOptions(u); err != nil {
		return nil, err
	}
	p.subO.Ordering = policy.Ordered
	_, ps, err := queryOf(u)
	if err != nil {
		return nil, err
	}
	for _, pv := range ps {
		name, v := pv.Name, pv.Value
		var perr error
		subOnly := false
		switch name {
		case "admin":
			au, err := url.Parse(v)
			if err != nil || (au.Scheme != "http" && au.Scheme != "https") || au.Host == "" {
				perr = errors.New("want http://host:port")
			}
			p.admin = v
		case "batching":
			var on bool
			switch v {
			case "on", "true", "key", "keybased":
				on = true
			case "off", "false", "none":
			default:
				perr = errors.New("want on (key-based) or off; the default batcher is never used")
			}
			p.topicO.DisableBatching = !on
		case "max_message_size":
			n, err := strconv.Atoi(v)
			if err != nil || n <= MetadataRoom {
				perr = fmt.Errorf("want a size in bytes above %d", MetadataRoom)
			}
			p.topicO.MaxMessageBytes = n
		case "subscription":
			subOnly = true
			p.sub = v
			if v == "" || strings.Contains(v, "/") {
				perr = errors.New("want a subscription name")
			}
		case "ordering":
			subOnly = true
			p.subO.Ordering, perr = policy.ParseOrdering(v)
		case "sticky":
			subOnly = true
			p.subO.StickyHashRanges, perr = parseRanges(v)
		case "receiver_queue", "max_batch":
			subOnly = true
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				perr = errors.New("want a positive integer")
			} else if name == "receiver_queue" {
				p.subO.ReceiverQueueSize = n
			} else {
				p.subO.MaxBatch = n
			}
		case "run_record":
			subOnly = true
			switch v {
			case "on", "true":
			case "off", "false":
				p.subO.NoRunRecord = true
			default:
				perr = errors.New("want on or off")
			}
		case "lease":
			subOnly = true
			p.subO.Lease, perr = time.ParseDuration(v)
			if perr == nil && p.subO.Lease < time.Second {
				perr = errors.New("want a duration of at least 1s")
			}
		default:
			if !clientParamNames[name] {
				perr = errors.New("unknown parameter")
			}
		}
		if perr == nil && subOnly && !forSub {
			perr = errors.New("a subscription parameter on a topic URL")
		}
		if perr != nil {
			return nil, badParam(u, name, perr.Error())
		}
	}
	if forSub && p.sub == "" {
		return nil, badParam(u, "subscription", "required")
	}
	p.subO.AdminURL = p.admin
	return p, nil
}

// parseRanges parses "0-32767,32768-65535".
func parseRanges(v string) ([]int, error) {
	var out []int
	for _, r := range strings.Split(v, ",") {
		a, b, ok := strings.Cut(r, "-")
		lo, err1 := strconv.Atoi(a)
		hi, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil {
			return nil, errors.New("want hash ranges like 0-32767,32768-65535")
		}
		out = append(out, lo, hi)
	}
	if _, err := pulsar.NewKeySharedPolicySticky(out); err != nil {
		return nil, err
	}
	return out, nil
}

// OpenTopicURL opens pulsar://host:port/tenant/namespace/topic. With an
// admin parameter it creates the topic if missing; otherwise the broker
// creates it on first use when it allows auto-creation.
func (o *URLOpener) OpenTopicURL(ctx context.Context, u *url.URL) (driver.Topic, error) {
	p, err := parseURL(u, false)
	if err != nil {
		return nil, err
	}
	if p.admin != "" {
		if err := CreateTopic(ctx, p.admin, p.topic); err != nil {
			return nil, err
		}
	}
	client, err := pulsar.NewClient(p.client)
	if err != nil {
		return nil, fmt.Errorf("pulsar: client for %s: %w", u.Host, err)
	}
	// The driver owns the client, also when ctx ends before the broker
	// answers: the client is closed when the late answer arrives.
	return openTopicOwning(ctx, client, p.topic, &p.topicO, true)
}

// OpenSubscriptionURL opens
// pulsar://host:port/tenant/namespace/topic?subscription=name&..., creating
// the subscription (and, with an admin parameter, the topic) if missing.
func (o *URLOpener) OpenSubscriptionURL(ctx context.Context, u *url.URL) (driver.Subscription, error) {
	p, err := parseURL(u, true)
	if err != nil {
		return nil, err
	}
	if p.admin != "" {
		if err := CreateTopic(ctx, p.admin, p.topic); err != nil {
			return nil, err
		}
	}
	client, err := pulsar.NewClient(p.client)
	if err != nil {
		return nil, fmt.Errorf("pulsar: client for %s: %w", u.Host, err)
	}
	return openSubscriptionOwning(ctx, client, p.topic, p.sub, &p.subO, true)
}

// adminPath maps persistent://t/n/x to /admin/v2/persistent/t/n/x.
func adminPath(adminURL, topic string) (string, error) {
	rest, ok := strings.CutPrefix(topic, "persistent://")
	if !ok {
		return "", fmt.Errorf("%w: pulsar: want a full persistent:// topic name, got %q", keyorder.ErrInvalidConfig, topic)
	}
	return strings.TrimRight(adminURL, "/") + "/admin/v2/persistent/" + rest, nil
}

var adminClient = &http.Client{Timeout: 30 * time.Second}

// CreateTopic creates the non-partitioned topic through the admin API at
// adminURL if it does not exist.
func CreateTopic(ctx context.Context, adminURL, topic string) error {
	path, err := adminPath(adminURL, topic)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, path, nil)
	if err != nil {
		return err
	}
	resp, err := adminClient.Do(req)
	if err != nil {
		return fmt.Errorf("pulsar: create topic %s: %w", topic, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 && resp.StatusCode != http.StatusConflict {
		return fmt.Errorf("pulsar: create topic %s: admin API %s: %s", topic, resp.Status, body)
	}
	return nil
}

// checkSubscription reads the topic's stats from the admin API and fails
// with ErrOrderingMismatch when sub exists with another type or policy.
func checkSubscription(ctx context.Context, adminURL, topic, sub string, want policy.Ordering) error {
	path, err := adminPath(adminURL, topic)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, path+"/stats", nil)
	if err != nil {
		return err
	}
	resp, err := adminClient.Do(req)
	if err != nil {
		return fmt.Errorf("pulsar: stats of %s: %w", topic, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil // no topic, no subscription
	}
	if resp.StatusCode/100 != 2 {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("pulsar: stats of %s: admin API %s: %s", topic, resp.Status, body)
	}
	var stats struct {
		Subscriptions map[string]struct {
			Type       string            `json:"type"`
			Properties map[string]string `json:"subscriptionProperties"`
		} `json:"subscriptions"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&stats); err != nil {
		return fmt.Errorf("pulsar: stats of %s: %w", topic, err)
	}
	st, ok := stats.Subscriptions[sub]
	if !ok {
		return nil
	}
	label, ok := st.Properties[PropOrdering]
	if !ok {
		return fmt.Errorf("%w: %s on %s has no %s property (not created by keyorder; type %s), want %v",
			ErrOrderingMismatch, sub, topic, PropOrdering, st.Type, want)
	}
	if got, err := policy.ParseOrdering(label); err != nil || got != want {
		return fmt.Errorf("%w: %s on %s was created with ordering %s (type %s), want %v",
			ErrOrderingMismatch, sub, topic, label, st.Type, want)
	}
	return nil
}

// warnOnly passes on warnings and errors only: the client logs every
// connection and subscription at INFO.
type warnOnly struct{ slog.Handler }

func (h warnOnly) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.Handler.Enabled(ctx, l)
}

func (h warnOnly) WithAttrs(as []slog.Attr) slog.Handler { return warnOnly{h.Handler.WithAttrs(as)} }

func (h warnOnly) WithGroup(name string) slog.Handler { return warnOnly{h.Handler.WithGroup(name)} }

// ErrorCode classifies the errors the opener returns, so the URL mux
// returns them as *keyorder.Error with the right code.
func (o *URLOpener) ErrorCode(err error) keyorder.ErrorCode { return errorCode(err) }
