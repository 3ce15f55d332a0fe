package watermill

import (
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
)

// Placeholders a URL template may hold.
const (
	PlaceholderTopic = "{topic}"
	PlaceholderGroup = "{group}"
)

// template is a checked URL template.
type template struct {
	raw      string
	hasGroup bool
}

// parseTemplate checks raw: it must hold {topic}, no other {...}
// placeholder, parse as a URL once filled in, and name a scheme registered
// for the side (topics or subscriptions) that will open it.
func parseTemplate(raw string, schemes []string) (template, error) {
	bad := func(why string, args ...any) error {
		return fmt.Errorf("%w: watermill URL template %q: %s", keyorder.ErrBadURL, redact(raw), fmt.Sprintf(why, args...))
	}
	if raw == "" {
		return template{}, bad("empty (want e.g. mem://{topic}?subscription={group})")
	}
	if !strings.Contains(raw, PlaceholderTopic) {
		return template{}, bad("no %s placeholder", PlaceholderTopic)
	}
	rest := strings.NewReplacer(PlaceholderTopic, "", PlaceholderGroup, "").Replace(raw)
	if i := strings.IndexAny(rest, "{}"); i >= 0 {
		return template{}, bad("unknown placeholder or stray brace at %q (want only %s and %s)", rest[i:], PlaceholderTopic, PlaceholderGroup)
	}
	t := template{raw: raw, hasGroup: strings.Contains(raw, PlaceholderGroup)}
	u, err := url.Parse(t.fill("topic", "group"))
	if err != nil {
		return template{}, bad("%v", err)
	}
	if u.Scheme == "" {
		return template{}, bad("no scheme (want e.g. mem://{topic})")
	}
	if !slices.Contains(schemes, u.Scheme) {
		return template{}, fmt.Errorf("%w %q in watermill URL template %q (forgotten import?); registered: %v",
			keyorder.ErrUnknownScheme, u.Scheme, redact(raw), schemes)
	}
	return t, nil
}

// fill substitutes the escaped topic and group.
func (t template) fill(topic, group string) string {
	return strings.NewReplacer(
		PlaceholderTopic, url.PathEscape(topic),
		PlaceholderGroup, url.PathEscape(group),
	).Replace(t.raw)
}

// redact hides a password in a URL (template) for errors and logs. It works
// on the text, since a template with placeholders in its host does not parse.
func redact(s string) string {
	i := strings.Index(s, "://")
	if i < 0 {
		return s
	}
	rest := s[i+3:]
	at := strings.IndexByte(rest, '@')
	if end := strings.IndexAny(rest, "/?#"); at < 0 || (end >= 0 && end < at) {
		return s
	}
	colon := strings.IndexByte(rest[:at], ':')
	if colon < 0 {
		return s
	}
	return s[:i+3] + rest[:colon] + ":xxxxx" + rest[at:]
}

// topicSchemes and subscriptionSchemes are the registered schemes.
func topicSchemes() []string        { return driver.DefaultMux().TopicSchemes() }
func subscriptionSchemes() []string { return driver.DefaultMux().SubscriptionSchemes() }
