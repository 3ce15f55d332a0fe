package postgres

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/urlfuzz"
	"github.com/keyorder/keyorder/policy"
)

// parseAll is what the opener does before connecting.
func parseAll(u *url.URL) error {
	_, _, _, conn, err := (&URLOpener{}).parse(u)
	if err != nil {
		return err
	}
	_, err = poolConfig(u, conn)
	return err
}

func FuzzURL(f *testing.F) {
	urlfuzz.Seed(f, "topic=t", "topic=t&subscription=s&ordering=%zz", "topic=t&topic=u", "topic=t&sslmode=disable&application_name=a", "topic=t&max_attempts=x", "topic=t&connect_timeout=%zz")
	f.Fuzz(func(t *testing.T, where uint8, user, secret, host, path, query string) {
		urlfuzz.Check(t, Scheme, where, user, secret, host, path, query, parseAll)
	})
}

func TestURLSecrets(t *testing.T) {
	for _, raw := range []string{
		"postgres://app:S3CRET@host/db?topic=t&bogus=1",
		"postgres://app:S3CRET@host/db?topic=t&ordering=%zz",
		"postgres://app@host/db?topic=t&password=S3CRET",
		"postgres://app@host/db?topic=t&sslpassword=S3CRET&sslmode=bogus",
		"postgres://app:S3CRET@host:99999999/db?topic=t",
		"postgres://app:S3CRET@host/db?topic=t&connect_timeout=x",
		"postgres://app:S3CRET@host/db?topic=t&topic=u",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		err = parseAll(u)
		if !errors.Is(err, keyorder.ErrBadURL) || strings.Contains(err.Error(), "S3CRET") {
			t.Errorf("%q: %v, want ErrBadURL without the secret", raw, err)
		}
	}
}

// TestURLSecretParams: a misspelled or unread secret-looking parameter, a
// userinfo password, or a keyword/value DSN is never echoed in an error,
// whichever parameter the error is about.
func TestURLSecretParams(t *testing.T) {
	for _, p := range []string{"pasword", "passwd", "secret_key", "access_token", "apikey", "sessiontoken", "private_key", "bogus"} {
		for _, raw := range []string{
			"postgres://app:s3cr3t@host/db?topic=t&" + p + "=s3cr3t",
			"postgres://app@host/db?" + p + "=s3cr3t&topic=t&max_batch=x",
			"postgres://app@host/db?topic=t&max_batch=x&" + p + "=s3cr3t",
		} {
			u, err := url.Parse(raw)
			if err != nil {
				t.Fatal(err)
			}
			if err := parseAll(u); !errors.Is(err, keyorder.ErrBadURL) || strings.Contains(err.Error(), "s3cr3t") {
				t.Errorf("%q: %v, want ErrBadURL without the secret", raw, err)
			}
		}
	}
	ctx := context.Background()
	for _, dsn := range []string{
		"host=localhost port=5432 user=app password=s3cr3t dbname=app",
		"password=s3cr3t host=db:5432",
	} {
		_, terr := driver.DefaultMux().OpenTopic(ctx, dsn)
		_, serr := driver.DefaultMux().OpenSubscription(ctx, dsn)
		for _, err := range []error{terr, serr} {
			if !errors.Is(err, keyorder.ErrBadURL) || strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), "not a URL") {
				t.Errorf("DSN %q: %v, want ErrBadURL saying it is not a URL, without the secret", dsn, err)
			}
		}
	}
}

// TestURLDefaultOrdering: a subscription a URL creates is Ordered unless
// the URL says otherwise, as on every backend; the opener's Options still
// set the default.
func TestURLDefaultOrdering(t *testing.T) {
	for raw, want := range map[string]policy.Ordering{
		"postgres://h/db?topic=t&subscription=s&create=true":                    policy.Ordered,
		"postgres://h/db?topic=t&subscription=s&create=true&ordering=parallel":  policy.Parallel,
		"postgres://h/db?topic=t&subscription=s&create=true&ordering=exclusive": policy.Exclusive,
	} {
		u, _ := url.Parse(raw)
		opts, _, _, _, err := (&URLOpener{}).parse(u)
		if err != nil || opts.Subscription.Ordering != want {
			t.Errorf("%s: %v, %v; want %v", raw, opts.Subscription.Ordering, err, want)
		}
	}
	u, _ := url.Parse("postgres://h/db?topic=t&subscription=s&create=true")
	o := &URLOpener{Options: Options{Subscription: &SubscriptionOptions{Ordering: policy.Exclusive}}}
	if opts, _, _, _, err := o.parse(u); err != nil || opts.Subscription.Ordering != policy.Exclusive {
		t.Errorf("opener default Exclusive: %v, %v", opts.Subscription.Ordering, err)
	}
}
