package driver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/keyorder/keyorder"
)

func TestRedact(t *testing.T) {
	for raw, want := range map[string]string{
		"postgres://app:PASS@h/db?topic=t":                     "postgres://app:xxxxx@h/db?topic=t",
		"postgres://app@h/db?password=PASS&sslpassword=P2&x=1": "postgres://app@h/db?password=xxxxx&sslpassword=xxxxx&x=1",
		"pulsar://h?authParams=PASS&AUTH_TOKEN=T":              "pulsar://h?authParams=xxxxx&AUTH_TOKEN=xxxxx",
		"sqs://q.fifo?endpoint=http%3A%2F%2Fu%3APASS%40h":      "sqs://q.fifo?endpoint=http%3A%2F%2Fu%3Axxxxx%40h",
		"sqs://q.fifo?pass%zzword=PASS":                        "sqs://q.fifo?xxxxx",
		"mem:u:PASS@t":                                         "mem:xxxxx",
		"mem://t#PASS":                                         "mem://t#xxxxx",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got := Redact(u); got != want {
			t.Errorf("Redact(%q) = %q, want %q", raw, got, want)
		}
	}
}

func TestQuery(t *testing.T) {
	u, _ := url.Parse("x://h?b=2&a=%41&&c=")
	ps, err := Query(u)
	if err != nil || len(ps) != 3 || ps[0] != (Param{Name: "b", Value: "2"}) || ps[1] != (Param{Name: "a", Value: "A"}) || ps[2] != (Param{Name: "c", Value: ""}) {
		t.Fatalf("Query = %v, %v", ps, err)
	}
	for raw, name := range map[string]string{
		"x://h?a=%zz":    `"a"`,
		"x://h?a=1&a=2":  `"a"`,
		"x://h?a=1;b=2":  `"a"`,
		"x://h?%zz=1":    `"%zz"`,
		"x://h?=1":       `""`,
		"x://h?password": "",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Query(u)
		if name == "" {
			if err != nil {
				t.Errorf("Query(%q) = %v, want nil", raw, err)
			}
			continue
		}
		if !errors.Is(err, keyorder.ErrBadURL) || !strings.Contains(err.Error(), "parameter "+name) {
			t.Errorf("Query(%q) = %v, want ErrBadURL naming %s", raw, err, name)
		}
	}
}

func TestParseURLNeverEchoes(t *testing.T) {
	for _, raw := range []string{"pg://u:PASS@h:%zz/", "pg://u:PASS@h:x/", "pg://h/%zzPASS", "pg://h?x=1#PASS"} {
		_, err := ParseURL(raw)
		if !errors.Is(err, keyorder.ErrBadURL) || strings.Contains(err.Error(), "PASS") {
			t.Errorf("ParseURL(%q) = %v, want ErrBadURL without the secret", raw, err)
		}
	}
}

// misspelled are parameter names that may hold a secret although no
// backend reads them: each must have its value hidden wherever a URL is
// echoed.
var misspelled = []string{"pasword", "passwd", "pwd", "secret_key", "access_token", "apikey", "api-key", "sessiontoken", "x_api_key", "private_key", "credentials", "AWS_SECRET_ACCESS_KEY"}

func TestIsSensitiveParamMisspellings(t *testing.T) {
	for _, name := range misspelled {
		if !IsSensitiveParam(name) {
			t.Errorf("IsSensitiveParam(%q) = false", name)
		}
	}
	for _, name := range []string{"topic", "ordering", "max_batch", "lease", "sslmode"} {
		if IsSensitiveParam(name) {
			t.Errorf("IsSensitiveParam(%q) = true", name)
		}
	}
}

func init() {
	RegisterParams("kotest", Params{
		Names:      []string{"topic", "max_batch", "missing_key", "code"},
		Secret:     []string{"code"},
		Deprecated: map[string]string{"maxbatch": "max_batch"},
	})
}

// TestRedactDeclaredParams: on a scheme that declares its parameters, the
// value of every undeclared one (a misspelling) is hidden, and so is a
// declared secret; declared non-secret values stay readable.
func TestRedactDeclaredParams(t *testing.T) {
	u, _ := url.Parse("kotest://u:PASS@h?topic=t&max_batch=2&maxbatch=3&missing_key=reject&code=PASS&pasord=PASS&zz=PASS")
	want := "kotest://u:xxxxx@h?topic=t&max_batch=2&maxbatch=3&missing_key=reject&code=xxxxx&pasord=xxxxx&zz=xxxxx"
	if got := Redact(u); got != want {
		t.Errorf("Redact = %q, want %q", got, want)
	}
	if got := URLSecrets("sqs://q.fifo?endpoint=" + url.QueryEscape("http://u:PASS@h")); !slices.Contains(got, "PASS") {
		t.Errorf("URLSecrets misses the password of an endpoint: %q", got)
	}
	for _, name := range misspelled {
		raw := "mem://t?" + url.QueryEscape(name) + "=PASS"
		if got := RedactString(raw); strings.Contains(got, "PASS") {
			t.Errorf("RedactString(%q) = %q", raw, got)
		}
		for _, s := range URLSecrets(raw) {
			if s == "" {
				t.Errorf("URLSecrets(%q) has an empty string", raw)
			}
		}
		if !strings.Contains(strings.Join(URLSecrets(raw), " "), "PASS") {
			t.Errorf("URLSecrets(%q) = %q, want the value", raw, URLSecrets(raw))
		}
	}
}

// TestQueryDeprecated: an old spelling is returned under the new name,
// both spellings together are an error, and the warning is logged once.
func TestQueryDeprecated(t *testing.T) {
	u, _ := url.Parse("kotest://h?maxbatch=3&topic=t")
	ps, err := Query(u)
	if err != nil || len(ps) != 2 || ps[0] != (Param{Name: "max_batch", Value: "3", Deprecated: "maxbatch"}) {
		t.Fatalf("Query = %v, %v", ps, err)
	}
	u, _ = url.Parse("kotest://h?maxbatch=3&max_batch=4")
	if _, err := Query(u); !errors.Is(err, keyorder.ErrBadURL) || !strings.Contains(err.Error(), `"max_batch"`) {
		t.Errorf("both spellings: %v, want ErrBadURL naming max_batch", err)
	}
	var buf bytes.Buffer
	u, _ = url.Parse("kotest://h?maxbatch=3&code=PASS")
	WarnDeprecated(slog.New(slog.NewTextHandler(&buf, nil)), u)
	if out := buf.String(); strings.Count(out, "level=WARN") != 1 || !strings.Contains(out, "maxbatch (now max_batch)") || strings.Contains(out, "PASS") {
		t.Errorf("warning: %q", out)
	}
}

// TestParseURLNeverEchoesDSN: a keyword/value DSN, or anything without a
// scheme, is not echoed, and the error says it is not a URL.
func TestParseURLNeverEchoesDSN(t *testing.T) {
	for _, raw := range []string{
		"host=db port=5432 user=app password=PASS dbname=x",
		"  password=PASS host=db",
		"dbname=x host=db:5432 password=PASS",
		"just/a/path?password=PASS&pasword=PASS",
		"//host/x?pasword=PASS",
	} {
		_, err := ParseURL(raw)
		if !errors.Is(err, keyorder.ErrBadURL) || strings.Contains(err.Error(), "PASS") {
			t.Errorf("ParseURL(%q) = %v, want ErrBadURL without the secret", raw, err)
		}
		if strings.HasPrefix(strings.TrimSpace(raw), "host=") && !strings.Contains(err.Error(), "is not a URL") {
			t.Errorf("ParseURL(%q) = %v, want it to say a DSN is not a URL", raw, err)
		}
	}
}

// An unknown parameter's error is a *keyorder.ParamError (matching
// ErrBadURL) naming it and, when the scheme declares a parameter close to
// it, suggesting that one; a known parameter with a bad value, or a name
// close to nothing, suggests nothing.
func TestBadParamSuggests(t *testing.T) {
	RegisterParams("suggesttest", Params{Names: []string{"subscription", "ordering", "max_batch", "oldest_first"}, Deprecated: map[string]string{"maxBatch": "max_batch"}})
	u, _ := url.Parse("suggesttest://t?subscripton=s&token=t0psecret")
	for _, tc := range []struct {
		param, why, want string
	}{
		{"subscripton", "unknown parameter", "subscription"},
		{"oldestFirst", "unknown parameter", "oldest_first"},
		{"ordering", "unknown parameter (a topic URL takes none)", ""}, // declared: no suggestion
		{"maxBatch", "unknown parameter", ""},                          // a deprecated spelling is declared
		{"token", "unknown parameter", ""},                             // nothing close
		{"subscripton", "want letters", ""},                            // not an unknown parameter
	} {
		err := BadParam(u, tc.param, tc.why)
		var pe *keyorder.ParamError
		if !errors.Is(err, keyorder.ErrBadURL) || !errors.As(err, &pe) || pe.Param != tc.param || pe.Reason != tc.why || pe.Suggestion != tc.want {
			t.Errorf("BadParam(%q, %q) = %v (%+v), want a ParamError suggesting %q", tc.param, tc.why, err, pe, tc.want)
			continue
		}
		hint := fmt.Sprintf("(did you mean %q?)", tc.want)
		if strings.Contains(err.Error(), "t0psecret") || (tc.want != "") != strings.Contains(err.Error(), hint) {
			t.Errorf("BadParam(%q, %q): %q", tc.param, tc.why, err)
		}
	}
	// An unregistered scheme: no suggestion, still a ParamError.
	v, _ := url.Parse("nosuchscheme://t")
	var pe *keyorder.ParamError
	if err := BadParam(v, "subscripton", "unknown parameter"); !errors.As(err, &pe) || pe.Suggestion != "" {
		t.Errorf("unregistered scheme: %v", err)
	}
}

// An unknown scheme close to a registered one is suggested; otherwise the
// error asks whether an import was forgotten.
func TestUnknownSchemeSuggests(t *testing.T) {
	m := &URLMux{}
	m.RegisterTopic("kafka", &opener{})
	m.RegisterTopic("postgres", &opener{})
	for raw, want := range map[string]string{
		"kafak://h/t":      `unknown URL scheme "kafak" (did you mean "kafka"?)`,
		"postgresql2://h/": `unknown URL scheme "postgresql2" (did you mean "postgres"?)`,
		"nats://h/s":       `unknown URL scheme "nats" (forgotten import?)`,
	} {
		_, err := m.OpenTopic(context.Background(), raw)
		if !errors.Is(err, keyorder.ErrUnknownScheme) || !strings.Contains(err.Error(), want) {
			t.Errorf("OpenTopic(%q) = %v, want %q", raw, err, want)
		}
	}
}
