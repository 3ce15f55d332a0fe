package pubsub

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/internal/urlfuzz"
	"github.com/keyorder/keyorder/policy"
)

func FuzzURL(f *testing.F) {
	urlfuzz.Seed(f, "subscription=s", "subscription=s&ordering=%zz", "subscription=s&subscription=t", "subscription=s&ackdeadline=30s&maxbatch=5&maxdeliveryattempts=5")
	f.Fuzz(func(t *testing.T, where uint8, user, secret, host, path, query string) {
		urlfuzz.Check(t, Scheme, where, user, secret, host, path, query, func(u *url.URL) error {
			_, _, err := parseTopicURL(u)
			return err
		})
		urlfuzz.Check(t, Scheme, where, user, secret, host, path, query, func(u *url.URL) error {
			_, _, _, _, err := parseSubscriptionURL(u)
			return err
		})
	})
}

func TestURLSecrets(t *testing.T) {
	for _, raw := range []string{
		"pubsub://app:S3CRET@p/t?subscription=s",
		"pubsub://p/t?subscription=s&password=S3CRET",
		"pubsub://p/t?subscription=s&token=S3CRET&ordering=%zz",
		"pubsub://p/t?subscription=s&ordering=%zz",
		"pubsub://p/t?subscription=s&subscription=s",
		"pubsub://p/t/?subscription=s",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		_, _, _, _, err = parseSubscriptionURL(u)
		if !errors.Is(err, keyorder.ErrBadURL) || strings.Contains(err.Error(), "S3CRET") {
			t.Errorf("subscription %q: %v, want ErrBadURL without the secret", raw, err)
		}
		_, _, err = parseTopicURL(u)
		if !errors.Is(err, keyorder.ErrBadURL) || strings.Contains(err.Error(), "S3CRET") {
			t.Errorf("topic %q: %v, want ErrBadURL without the secret", raw, err)
		}
	}
}

// TestURLSecretParams: a misspelled or unread secret-looking parameter is
// never echoed, whichever parameter the error is about.
func TestURLSecretParams(t *testing.T) {
	for _, p := range []string{"pasword", "passwd", "secret_key", "access_token", "apikey", "sessiontoken", "private_key", "credentials_json", "bogus"} {
		for _, raw := range []string{
			"pubsub://p/t?subscription=s&" + p + "=s3cr3t",
			"pubsub://p/t?" + p + "=s3cr3t&subscription=s&max_batch=x",
			"pubsub://p/t?subscription=s&max_batch=x&" + p + "=s3cr3t",
		} {
			u, err := url.Parse(raw)
			if err != nil {
				t.Fatal(err)
			}
			_, _, _, _, serr := parseSubscriptionURL(u)
			_, _, terr := parseTopicURL(u)
			for _, err := range []error{serr, terr} {
				if !errors.Is(err, keyorder.ErrBadURL) || strings.Contains(err.Error(), "s3cr3t") {
					t.Errorf("%q: %v, want ErrBadURL without the secret", raw, err)
				}
			}
		}
	}
}

// TestURLSpellings: the spellings every backend shares (lease, max_batch,
// max_attempts) and the old ones configure the same; both together are an
// error; ordering defaults to Ordered.
func TestURLSpellings(t *testing.T) {
	parse := func(q string) (SubscriptionOptions, error) {
		u, _ := url.Parse("pubsub://p/t?subscription=s&" + q)
		_, _, _, o, err := parseSubscriptionURL(u)
		return o, err
	}
	oldO, err1 := parse("ackdeadline=20s&maxbatch=7&maxdeliveryattempts=9")
	newO, err2 := parse("lease=20s&max_batch=7&max_attempts=9")
	if err1 != nil || err2 != nil || oldO != newO || newO.Lease != 20*time.Second || newO.MaxBatch != 7 || newO.MaxDeliveryAttempts != 9 {
		t.Errorf("old %+v %v, new %+v %v; want the same, 20s, 7 and 9", oldO, err1, newO, err2)
	}
	if newO.Ordering != policy.Ordered {
		t.Errorf("default ordering %v, want ordered", newO.Ordering)
	}
	for _, q := range []string{"ackdeadline=20s&lease=20s", "maxbatch=7&max_batch=7", "max_attempts=9&maxdeliveryattempts=9"} {
		if _, err := parse(q); !errors.Is(err, keyorder.ErrBadURL) || !strings.Contains(err.Error(), "given twice") {
			t.Errorf("%s: %v, want ErrBadURL (given twice)", q, err)
		}
	}
}
