package adapters

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/keyorder/keyorder"
)

// Every URL opener goes through the helpers of this file, so that all
// schemes follow one set of rules:
//
//   - A URL that echoes into an error, a log or a Delivery is redacted
//     first (Redact): the userinfo password, the value of every sensitive
//     query parameter (IsSensitiveParam) and any fragment are replaced by
//     "xxxxx". A URL that cannot be parsed is never echoed at all.
//   - Query parameters are parsed strictly (Query): a malformed escape, a
//     ';' separator, an empty name or a parameter given twice is
//     keyorder.ErrBadURL naming the parameter, never silently dropped or
//     resolved by picking one of the values.

// redacted replaces a secret in a URL shown to a human.
const redacted = "xxxxx"

// sensitiveWords mark a query parameter as secret when its lower-cased name
// contains one of them ("password", "sslpassword", "authParams", "token",
// "aws_secret_access_key", ...).
var sensitiveWords = []string{"password", "passwd", "secret", "token", "auth", "credential", "apikey", "api_key", "private", "signature"}

// IsSensitiveParam reports whether the query parameter name carries a
// secret whose value Redact hides.
func IsSensitiveParam(name string) bool {
	n := strings.ToLower(name)
	for _, w := range sensitiveWords {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// Redact returns u as a string safe to show in errors and logs: the
// userinfo password, the values of sensitive query parameters (and of any
// parameter whose name cannot be decoded), passwords inside URL-valued
// parameters, an opaque part holding userinfo and the fragment are replaced
// by "xxxxx". It never fails; u is not modified.
func Redact(u *url.URL) string {
	if u == nil {
		return ""
	}
	c := *u
	if c.User != nil {
		if _, ok := c.User.Password(); ok {
			c.User = url.UserPassword(c.User.Username(), redacted)
		}
	}
	if c.Opaque != "" && strings.ContainsAny(c.Opaque, "@?#") {
		c.Opaque = redacted
	}
	if c.Fragment != "" || c.RawFragment != "" {
		c.Fragment, c.RawFragment = redacted, ""
	}
	c.RawQuery = redactQuery(c.RawQuery)
	c.ForceQuery = false
	return c.String()
}

// redactQuery hides the sensitive values of a raw query, keeping the rest
// byte for byte.
func redactQuery(raw string) string {
	if raw == "" {
		return ""
	}
	parts := strings.Split(raw, "&")
	for i, p := range parts {
		k, v, hasV := strings.Cut(p, "=")
		name, err := url.QueryUnescape(k)
		switch {
		case err != nil || strings.Contains(k, ";"):
			// A name that cannot be read may be anything: hide it all.
			parts[i] = redacted
		case !hasV:
		case IsSensitiveParam(name):
			parts[i] = k + "=" + redacted
		case strings.Contains(v, "%40") || strings.Contains(v, "@"):
			// A URL-valued parameter (an endpoint) may carry userinfo.
			dv, err := url.QueryUnescape(v)
			if err != nil {
				parts[i] = k + "=" + redacted
				break
			}
			if iu, err := url.Parse(dv); err != nil {
				parts[i] = k + "=" + redacted
			} else if _, ok := iu.User.Password(); ok || iu.Opaque != "" {
				parts[i] = k + "=" + url.QueryEscape(Redact(iu))
			}
		}
	}
	return strings.Join(parts, "&")
}

// redactRaw describes a URL string that did not parse, without echoing
// anything that could be a secret: only a scheme that looks like one.
func redactRaw(raw string) string {
	if i := strings.Index(raw, "://"); i > 0 && isScheme(raw[:i]) {
		return raw[:i] + "://" + redacted
	}
	return redacted
}

func isScheme(s string) bool {
	for i, r := range s {
		switch {
		case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z':
		case i > 0 && ('0' <= r && r <= '9' || r == '+' || r == '-' || r == '.'):
		default:
			return false
		}
	}
	return s != ""
}

// Param is one query parameter, as given in the URL.
type Param struct {
	Name, Value string
}

// Query parses u's query strictly and returns its parameters in URL order.
// Unlike u.Query(), which silently drops what it cannot decode, it fails
// with an error matching keyorder.ErrBadURL that names the parameter when a
// name or value has a malformed escape ("%zz"), a parameter has an empty
// name, the separator ';' is used, or a parameter is given more than once.
// Empty segments ("a=1&&b=2") are ignored. Every opener reads its
// parameters with Query.
func Query(u *url.URL) ([]Param, error) {
	if u.RawQuery == "" {
		return nil, nil
	}
	var out []Param
	seen := map[string]bool{}
	for _, seg := range strings.Split(u.RawQuery, "&") {
		if seg == "" {
			continue
		}
		k, v, _ := strings.Cut(seg, "=")
		name, err := url.QueryUnescape(k)
		if err != nil || strings.Contains(seg, ";") {
			// The raw name is shown: a name is not a secret, and the
			// value is never shown.
			why := "malformed escape in the name"
			if err == nil {
				why = "';' is not a parameter separator (use '&')"
			}
			return nil, BadParam(u, k, why)
		}
		if name == "" {
			return nil, BadParam(u, "", "empty parameter name")
		}
		value, err := url.QueryUnescape(v)
		if err != nil {
			return nil, BadParam(u, name, "malformed escape in the value")
		}
		if seen[name] {
			return nil, BadParam(u, name, "given more than once")
		}
		seen[name] = true
		out = append(out, Param{Name: name, Value: value})
	}
	return out, nil
}

// BadParam returns the error an opener gives for an invalid or unknown query
// parameter; it matches keyorder.ErrBadURL. The URL in the error is
// redacted; why must not quote a sensitive parameter's value.
func BadParam(u *url.URL, param, why string) error {
	return &URLError{URL: Redact(u), Err: fmt.Errorf("%w: parameter %q: %s", keyorder.ErrBadURL, param, why)}
}

// BadURL returns the error an opener gives for a URL it cannot use for a
// reason other than one parameter (a missing topic name, say); it matches
// keyorder.ErrBadURL and carries the redacted URL.
func BadURL(u *url.URL, why string) error {
	return &URLError{URL: Redact(u), Err: fmt.Errorf("%w: %s", keyorder.ErrBadURL, why)}
}
