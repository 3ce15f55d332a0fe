package pubsub

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/internal/urlfuzz"
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
