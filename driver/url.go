package driver

import (
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/internal/suggest"
)

// Every URL opener goes through the helpers of this file, so that all
// schemes follow one set of rules:
//
//   - A URL that echoes into an error, a log or a Delivery is redacted
//     first (Redact): the userinfo password, the value of every sensitive
//     query parameter (IsSensitiveParam), the value of every parameter the
//     scheme does not declare (RegisterParams: a misspelled "pasword" may
//     hold a password), an opaque part, a path that looks like key=value
//     pairs and any fragment are replaced by "xxxxx". A URL that cannot be
//     parsed, or has no scheme (a keyword/value DSN such as
//     "host=db password=..."), is never echoed at all.
//   - Query parameters are parsed strictly (Query): a malformed escape, a
//     ';' separator, an empty name or a parameter given twice (also under
//     an old and a new spelling) is keyorder.ErrBadURL naming the
//     parameter, never silently dropped or resolved by picking one of the
//     values.
//   - Each scheme declares its parameters (RegisterParams): one spelling per
//     concept, snake_case, with the old spellings still accepted (Query
//     returns them under the new name; the mux logs a deprecation warning
//     once per Open).

// redacted replaces a secret in a URL shown to a human.
const redacted = "xxxxx"

// sensitiveWords mark a query parameter as secret when its name, lower-cased
// and without separators, contains one of them: "password", "sslpassword"
// and misspellings ("pasword", "passwd", "pwd"), "authParams", "token",
// "access_token", "aws_secret_access_key", "apikey", "session_token", ...
var sensitiveWords = []string{
	"pas", "pwd", "pword", "psw", "secret", "token", "auth", "cred", "apikey", "accesskey",
	"privatekey", "private", "signature", "session", "cookie", "bearer", "jwt", "sasl",
}

// IsSensitiveParam reports whether the query parameter name may carry a
// secret whose value Redact hides: its name contains a word of password,
// secret, token, credential or key material (see sensitiveWords), or its
// last segment is "key" ("secret_key", "x-api-key"). A name a scheme
// declares (RegisterParams) is judged by the words only: "missing_key" or
// "max_key" of a scheme that reads them are not secrets.
func IsSensitiveParam(name string) bool {
	if hasSensitiveWord(name) {
		return true
	}
	segs := strings.FieldsFunc(strings.ToLower(name), func(r rune) bool { return !isAlnum(r) })
	return len(segs) > 0 && segs[len(segs)-1] == "key"
}

func hasSensitiveWord(name string) bool {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		if isAlnum(r) {
			b.WriteRune(r)
		}
	}
	n := b.String()
	for _, w := range sensitiveWords {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

func isAlnum(r rune) bool { return 'a' <= r && r <= 'z' || '0' <= r && r <= '9' || r > 127 }

// Params declares the query parameters of a URL scheme (RegisterParams).
type Params struct {
	// Names are the parameters the scheme reads, each in its one current
	// spelling (snake_case for several words), including parameters it
	// passes through to a client library (PostgreSQL's sslmode, ...).
	Names []string
	// Secret lists the names whose value is a secret although the name
	// does not say so (IsSensitiveParam decides for the others).
	Secret []string
	// Deprecated maps an old spelling to its name in Names. Query returns
	// a parameter given under an old spelling under its current name; the
	// mux logs a deprecation warning once per Open.
	Deprecated map[string]string
}

var (
	paramsMu     sync.RWMutex
	schemeParams = map[string]*Params{}
)

// RegisterParams declares scheme's query parameters. Adapters call it in
// init() for each scheme they register. Redact then hides the value of
// every parameter scheme does not declare, and Query maps deprecated
// spellings to the current ones. It panics if the scheme is declared twice
// or a deprecated spelling maps to an undeclared name (programmer errors).
func RegisterParams(scheme string, p Params) {
	paramsMu.Lock()
	defer paramsMu.Unlock()
	if _, dup := schemeParams[scheme]; dup {
		panic("keyorder: RegisterParams called twice for scheme " + scheme)
	}
	for old, cur := range p.Deprecated {
		if !slices.Contains(p.Names, cur) || slices.Contains(p.Names, old) {
			panic(fmt.Sprintf("keyorder: RegisterParams(%s): deprecated %q maps to %q", scheme, old, cur))
		}
	}
	c := p
	schemeParams[scheme] = &c
}

func paramsOf(scheme string) *Params {
	paramsMu.RLock()
	defer paramsMu.RUnlock()
	return schemeParams[strings.ToLower(scheme)]
}

// canonical returns the current spelling of name for p (name itself when
// it is current or unknown) and whether name is an old spelling.
func (p *Params) canonical(name string) (string, bool) {
	if p == nil {
		return name, false
	}
	if cur, ok := p.Deprecated[name]; ok {
		return cur, true
	}
	return name, false
}

// hides reports whether Redact hides the value of parameter name on a
// scheme declared with p (nil: undeclared scheme, judged by the name).
func (p *Params) hides(name string) bool {
	if p == nil {
		return IsSensitiveParam(name)
	}
	cur, _ := p.canonical(name)
	if !slices.Contains(p.Names, cur) {
		return true // unknown: a misspelling may hold anything
	}
	return hasSensitiveWord(name) || hasSensitiveWord(cur) || slices.Contains(p.Secret, cur)
}

// Redact returns u as a string safe to show in errors and logs: the
// userinfo password, the values of sensitive query parameters, of
// parameters the scheme does not declare (and of any parameter whose name
// cannot be decoded), passwords inside URL-valued parameters, an opaque
// part, a path holding '=' (a keyword/value string) and the fragment are
// replaced by "xxxxx". It never fails; u is not modified.
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
	if c.Opaque != "" {
		c.Opaque = redacted
	}
	if strings.Contains(c.Path, "=") || strings.Contains(c.RawPath, "=") {
		c.Path, c.RawPath = "/"+redacted, ""
	}
	if c.Fragment != "" || c.RawFragment != "" {
		c.Fragment, c.RawFragment = redacted, ""
	}
	c.RawQuery = redactQuery(paramsOf(u.Scheme), c.RawQuery)
	c.ForceQuery = false
	return c.String()
}

// RedactString is Redact for a URL string: a string that does not parse
// as a URL with a scheme (a keyword/value DSN, say) is never echoed, only
// its scheme when it looks like one.
func RedactString(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return redactRaw(raw)
	}
	return Redact(u)
}

// URLSecrets returns the substrings of raw that Redact hides (in the forms
// they may take when echoed: as written, decoded, query- and
// path-escaped), so that a program can also strip them from text that
// quotes them outside the URL (a broker's error message). A string that
// does not parse as a URL with a scheme is a secret as a whole.
func URLSecrets(raw string) []string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return []string{raw}
	}
	var out []string
	add := func(s string) {
		if s != "" {
			out = append(out, s, url.QueryEscape(s), url.PathEscape(s))
		}
	}
	if p, ok := u.User.Password(); ok {
		add(p)
	}
	if u.Opaque != "" {
		add(u.Opaque)
	}
	if strings.Contains(u.Path, "=") || strings.Contains(u.RawPath, "=") {
		add(u.Path)
		add(u.RawPath)
	}
	add(u.Fragment)
	p := paramsOf(u.Scheme)
	for _, seg := range strings.Split(u.RawQuery, "&") {
		k, v, _ := strings.Cut(seg, "=")
		name, err := url.QueryUnescape(k)
		dv, derr := url.QueryUnescape(v)
		switch {
		case err != nil || strings.Contains(seg, ";") || p.hides(name):
			out = append(out, v)
			if derr == nil {
				add(dv)
			}
		case derr == nil && strings.Contains(dv, "@"):
			// A URL-valued parameter (an endpoint) may carry userinfo.
			if iu, err := url.Parse(dv); err == nil {
				if pw, ok := iu.User.Password(); ok {
					add(pw)
				}
			}
		}
	}
	return slices.DeleteFunc(out, func(s string) bool { return s == "" })
}

// redactQuery hides the sensitive values of a raw query, keeping the rest
// byte for byte.
func redactQuery(p *Params, raw string) string {
	if raw == "" {
		return ""
	}
	parts := strings.Split(raw, "&")
	for i, part := range parts {
		k, v, hasV := strings.Cut(part, "=")
		name, err := url.QueryUnescape(k)
		switch {
		case err != nil || strings.Contains(k, ";"):
			// A name that cannot be read may be anything: hide it all.
			parts[i] = redacted
		case !hasV:
		case p.hides(name):
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

// looksLikeDSN reports whether raw is a keyword/value connection string
// ("host=db port=5432 password=..."): it starts with a keyword and '='
// and is not a scheme://... URL.
func looksLikeDSN(raw string) bool {
	s := strings.TrimSpace(raw)
	i := strings.IndexAny(s, "= ")
	if i <= 0 || strings.Contains(s, "://") {
		return false
	}
	for _, r := range s[:i] {
		if !isAlnum(r) && r != '_' && !('A' <= r && r <= 'Z') {
			return false
		}
	}
	return strings.HasPrefix(strings.TrimLeft(s[i:], " "), "=")
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
	// Name is the parameter's current spelling; Value its decoded value.
	Name, Value string
	// Deprecated is the old spelling the URL used, if it used one (see
	// RegisterParams); Name is then the current one.
	Deprecated string
}

// Query parses u's query strictly and returns its parameters in URL order.
// Unlike u.Query(), which silently drops what it cannot decode, it fails
// with an error matching keyorder.ErrBadURL that names the parameter when a
// name or value has a malformed escape ("%zz"), a parameter has an empty
// name, the separator ';' is used, or a parameter is given more than once
// (also under its current and a deprecated spelling). A parameter given
// under a deprecated spelling of u's scheme (RegisterParams) is returned
// under its current name. Empty segments ("a=1&&b=2") are ignored. Every
// opener reads its parameters with Query.
func Query(u *url.URL) ([]Param, error) {
	if u.RawQuery == "" {
		return nil, nil
	}
	spec := paramsOf(u.Scheme)
	var out []Param
	seen := map[string]string{}
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
		cur, old := spec.canonical(name)
		if prev, dup := seen[cur]; dup {
			if prev == name {
				return nil, BadParam(u, cur, "given more than once")
			}
			return nil, BadParam(u, cur, fmt.Sprintf("given twice, as %q and as %q (the deprecated spelling): give it once, as %q", prev, name, cur))
		}
		seen[cur] = name
		p := Param{Name: cur, Value: value}
		if old {
			p.Deprecated = name
		}
		out = append(out, p)
	}
	return out, nil
}

// WarnDeprecated logs on l (slog.Default() when nil), once, the deprecated
// parameter spellings u uses, each with its current spelling. The mux calls
// it once per Open.
func WarnDeprecated(l *slog.Logger, u *url.URL) {
	ps, err := Query(u)
	if err != nil {
		return
	}
	var olds []string
	for _, p := range ps {
		if p.Deprecated != "" {
			olds = append(olds, p.Deprecated+" (now "+p.Name+")")
		}
	}
	if len(olds) == 0 {
		return
	}
	if l == nil {
		l = slog.Default()
	}
	l.Warn("keyorder: deprecated URL parameter spelling; it is still accepted", "url", Redact(u), "deprecated", strings.Join(olds, ", "))
}

// BadParam returns the error an opener gives for an invalid or unknown query
// parameter; it matches keyorder.ErrBadURL and unwraps to a
// *keyorder.ParamError naming the parameter. When why starts with "unknown
// parameter" and the scheme declares a parameter close to param
// (RegisterParams), the error suggests it: `parameter "subscripton":
// unknown parameter (did you mean "subscription"?)`. The URL in the error
// is redacted; why must not quote a sensitive parameter's value.
func BadParam(u *url.URL, param, why string) error {
	pe := &keyorder.ParamError{Param: param, Reason: why}
	if strings.HasPrefix(why, "unknown parameter") {
		pe.Suggestion = suggestParam(u.Scheme, param)
	}
	return &URLError{URL: Redact(u), Err: pe}
}

// suggestParam returns the parameter scheme declares (RegisterParams) that
// param was probably meant to be, "" when param is declared (under its
// current or a deprecated spelling) or nothing is close.
func suggestParam(scheme, param string) string {
	p := paramsOf(scheme)
	if p == nil {
		return ""
	}
	if cur, _ := p.canonical(param); slices.Contains(p.Names, cur) {
		return ""
	}
	return suggest.Closest(param, p.Names)
}

// BadURL returns the error an opener gives for a URL it cannot use for a
// reason other than one parameter (a missing topic name, say); it matches
// keyorder.ErrBadURL and carries the redacted URL.
func BadURL(u *url.URL, why string) error {
	return &URLError{URL: Redact(u), Err: fmt.Errorf("%w: %s", keyorder.ErrBadURL, why)}
}
