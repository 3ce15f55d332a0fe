// Package urlfuzz is the shared body of the URL fuzz targets of every
// adapter: each adapter's FuzzURL feeds it the adapter's own parse function,
// so that all schemes are held to the same promises — no panic, no secret
// echoed in an error, no parameter silently dropped.
package urlfuzz

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
)

// Marker starts every secret the fuzz targets plant; it appears in no
// error text of the library.
const Marker = "S3cr3tM4rk"

// Seed adds the seeds every scheme starts from: hostile and careless URLs
// with the secret in the userinfo and in sensitive parameters.
func Seed(f *testing.F, queries ...string) {
	base := []string{"", "bogus=1", "a=%zz", "a=1&a=2", "a;b=1", "=x", "%zz=1", "a=1&&b=2", "x=1#frag", "endpoint=http%3A%2F%2Fu%3Ap%40h"}
	for _, q := range append(base, queries...) {
		f.Add(uint8(15), "app", "pw", "host", "/path", q)
		f.Add(uint8(0), "", "", "host", "", q)
		f.Add(uint8(4), "", "pw", "", "", q)
	}
}

// Check builds scheme://user:SECRET@host path?query&password=SECRET&
// sslpassword=SECRET&pasword=SECRET (where, a bit mask, says which of the
// four secrets are planted: 1 userinfo, 2 password, 4 sslpassword, 8 the
// misspelled pasword, which no scheme reads), parses
// it as the mux does and then with parse (the adapter's URL parsing), and
// fails t if an error echoes the secret, an error does not match
// keyorder.ErrBadURL, or parsing succeeded although the query had a
// malformed or repeated parameter that would have been dropped.
func Check(t *testing.T, scheme string, where uint8, user, secret, host, path, query string, parse func(*url.URL) error) {
	secret = Marker + secret
	for _, part := range []string{scheme, user, host, path, query} {
		if strings.Contains(strings.ToLower(part), strings.ToLower(Marker)) {
			t.Skip("the marker is in a non-secret part")
		}
	}
	var ui string
	if where&1 != 0 {
		ui = url.UserPassword(user, secret).String() + "@"
	}
	q := []string{}
	if query != "" {
		q = append(q, query)
	}
	if where&2 != 0 {
		q = append(q, "password="+url.QueryEscape(secret))
	}
	if where&4 != 0 {
		q = append(q, "sslpassword="+url.QueryEscape(secret))
	}
	if where&8 != 0 {
		q = append(q, "pasword="+url.QueryEscape(secret))
	}
	raw := scheme + "://" + ui + host + path
	if len(q) > 0 {
		raw += "?" + strings.Join(q, "&")
	}
	check := func(err error) {
		if err == nil {
			return
		}
		if strings.Contains(strings.ToLower(err.Error()), strings.ToLower(Marker)) {
			t.Fatalf("error echoes the secret:\nurl %q\nerr %v", raw, err)
		}
	}
	u, err := driver.ParseURL(raw)
	check(err)
	if err != nil {
		if !errors.Is(err, keyorder.ErrBadURL) {
			t.Fatalf("ParseURL(%q) = %v, want ErrBadURL", raw, err)
		}
		return
	}
	if s := driver.Redact(u); strings.Contains(strings.ToLower(s), strings.ToLower(Marker)) {
		t.Fatalf("Redact(%q) = %q echoes the secret", raw, s)
	}
	err = parse(u)
	check(err)
	if err == nil {
		if _, qerr := url.ParseQuery(u.RawQuery); qerr != nil {
			t.Fatalf("%q accepted although its query is malformed (%v)", raw, qerr)
		}
		vs, _ := url.ParseQuery(u.RawQuery)
		for k, v := range vs {
			if len(v) > 1 {
				t.Fatalf("%q accepted with %q given %d times", raw, k, len(v))
			}
		}
	}
}
