package driver

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"sync"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/internal/suggest"
)

// TopicURLOpener opens a Topic driver from a URL.
type TopicURLOpener interface {
	OpenTopicURL(ctx context.Context, u *url.URL) (Topic, error)
}

// SubscriptionURLOpener opens a Subscription driver from a URL.
type SubscriptionURLOpener interface {
	OpenSubscriptionURL(ctx context.Context, u *url.URL) (Subscription, error)
}

// URLMux maps URL schemes to openers.
type URLMux struct {
	mu     sync.RWMutex
	topics map[string]TopicURLOpener
	subs   map[string]SubscriptionURLOpener
}

var defaultMux = &URLMux{}

// DefaultMux returns the mux adapters register on in init() and that
// publish.Open and subscribe.Open use.
func DefaultMux() *URLMux { return defaultMux }

// RegisterTopic registers o for scheme. It panics if o is nil or the scheme
// is already registered, as database/sql.Register does: both are programmer
// errors.
func (m *URLMux) RegisterTopic(scheme string, o TopicURLOpener) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if o == nil {
		panic("keyorder: RegisterTopic opener is nil for scheme " + scheme)
	}
	if _, dup := m.topics[scheme]; dup {
		panic("keyorder: RegisterTopic called twice for scheme " + scheme)
	}
	if m.topics == nil {
		m.topics = map[string]TopicURLOpener{}
	}
	m.topics[scheme] = o
}

// RegisterSubscription registers o for scheme, panicking like RegisterTopic.
func (m *URLMux) RegisterSubscription(scheme string, o SubscriptionURLOpener) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if o == nil {
		panic("keyorder: RegisterSubscription opener is nil for scheme " + scheme)
	}
	if _, dup := m.subs[scheme]; dup {
		panic("keyorder: RegisterSubscription called twice for scheme " + scheme)
	}
	if m.subs == nil {
		m.subs = map[string]SubscriptionURLOpener{}
	}
	m.subs[scheme] = o
}

// TopicSchemes returns the registered topic schemes, sorted.
func (m *URLMux) TopicSchemes() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return sortedKeys(m.topics)
}

// SubscriptionSchemes returns the registered subscription schemes, sorted.
func (m *URLMux) SubscriptionSchemes() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return sortedKeys(m.subs)
}

func sortedKeys[V any](mp map[string]V) []string {
	out := make([]string, 0, len(mp))
	for k := range mp {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// unknownScheme is the error for a URL whose scheme no adapter
// registered: it suggests a registered scheme close to it (a typo), else
// an import the program may have forgotten.
func unknownScheme(u *url.URL, registered []string) error {
	hint := "(forgotten import?)"
	if s := suggest.Closest(u.Scheme, registered); s != "" {
		hint = fmt.Sprintf("(did you mean %q?)", s)
	}
	return &URLError{URL: Redact(u), Err: fmt.Errorf("%w %q %s; registered: %v", keyorder.ErrUnknownScheme, u.Scheme, hint, registered)}
}

// OpenTopic opens the Topic driver for urlstr.
func (m *URLMux) OpenTopic(ctx context.Context, urlstr string) (Topic, error) {
	u, err := ParseURL(urlstr)
	if err != nil {
		return nil, err
	}
	m.mu.RLock()
	o, ok := m.topics[u.Scheme]
	m.mu.RUnlock()
	if !ok {
		return nil, unknownScheme(u, m.TopicSchemes())
	}
	WarnDeprecated(nil, u)
	t, err := o.OpenTopicURL(ctx, u)
	if err != nil {
		return nil, WrapError("open", err, codeOf(o))
	}
	return t, nil
}

// OpenSubscription opens the Subscription driver for urlstr.
func (m *URLMux) OpenSubscription(ctx context.Context, urlstr string) (Subscription, error) {
	u, err := ParseURL(urlstr)
	if err != nil {
		return nil, err
	}
	m.mu.RLock()
	o, ok := m.subs[u.Scheme]
	m.mu.RUnlock()
	if !ok {
		return nil, unknownScheme(u, m.SubscriptionSchemes())
	}
	WarnDeprecated(nil, u)
	sub, err := o.OpenSubscriptionURL(ctx, u)
	if err != nil {
		return nil, WrapError("open", err, codeOf(o))
	}
	return sub, nil
}

// ErrorCoder is implemented by URL openers that classify the broker errors
// they return (each driver's ErrorCode), so that the mux returns them as
// *keyorder.Error with the right code.
type ErrorCoder interface {
	ErrorCode(err error) keyorder.ErrorCode
}

func codeOf(o any) func(error) keyorder.ErrorCode {
	if c, ok := o.(ErrorCoder); ok {
		return c.ErrorCode
	}
	return nil
}

// WrapError returns err as the portable API returns errors: unchanged when
// it already matches a keyorder sentinel (a *keyorder.Error, an ErrBadURL,
// ...) or is the context's error, else as a *keyorder.Error for op with the
// code classify gives it (CodeUnknown when classify is nil). So every error
// of the portable API matches a keyorder sentinel and carries a code
// keyorder.Code reads.
func WrapError(op string, err error, classify func(error) keyorder.ErrorCode) error {
	if err == nil {
		return nil
	}
	var ke *keyorder.Error
	if errors.As(err, &ke) || keyorder.Code(err) != keyorder.CodeUnknown {
		return err
	}
	code := keyorder.CodeUnknown
	if classify != nil {
		code = classify(err)
	}
	return &keyorder.Error{Code: code, Op: op, Err: err}
}

// URLError reports a URL that cannot be opened. It unwraps to the cause,
// which matches keyorder.ErrBadURL or keyorder.ErrUnknownScheme.
type URLError struct {
	// URL is the URL as Redact shows it: never a password or other secret.
	URL string
	Err error
}

// Error implements error.
func (e *URLError) Error() string { return fmt.Sprintf("keyorder: open %q: %v", e.URL, e.Err) }

// Unwrap returns the cause.
func (e *URLError) Unwrap() error { return e.Err }

// ParseURL parses urlstr and requires a scheme. It rejects a fragment (no
// opener reads one, so it would be silently dropped). Its errors never echo
// the URL when it cannot be parsed or has no scheme: only its scheme. A
// keyword/value connection string ("host=db password=...") is rejected as
// not a URL, without echoing it.
func ParseURL(urlstr string) (*url.URL, error) {
	if looksLikeDSN(urlstr) {
		return nil, &URLError{URL: redacted, Err: fmt.Errorf("%w: a keyword/value connection string (host=... password=...) is not a URL: "+
			"write it as a URL (postgres://user:password@host:5432/db?topic=...)", keyorder.ErrBadURL)}
	}
	u, err := url.Parse(urlstr)
	if err != nil {
		why := "cannot be parsed as a URL"
		var ue *url.Error
		if errors.As(err, &ue) && !strings.ContainsAny(ue.Err.Error(), "\"'`") {
			// A fixed message ("missing protocol scheme"), quoting nothing
			// of the URL.
			why += ": " + ue.Err.Error()
		}
		return nil, &URLError{URL: redactRaw(urlstr), Err: fmt.Errorf("%w: %s", keyorder.ErrBadURL, why)}
	}
	if u.Scheme == "" {
		return nil, &URLError{URL: redactRaw(urlstr), Err: fmt.Errorf("%w: no scheme (want e.g. mem://topic)", keyorder.ErrBadURL)}
	}
	if u.Fragment != "" || strings.Contains(urlstr, "#") {
		return nil, &URLError{URL: Redact(u), Err: fmt.Errorf("%w: a fragment (#...) is not allowed", keyorder.ErrBadURL)}
	}
	return u, nil
}
