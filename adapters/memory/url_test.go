package memory

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/internal/urlfuzz"
)

func FuzzURL(f *testing.F) {
	urlfuzz.Seed(f, "subscription=s", "subscription=s&ordering=%zz", "maxkey=3", "payload=required&payload=optional", "subscription=s&lease=1s&maxbatch=2&chain=2&hold=native")
	f.Fuzz(func(t *testing.T, where uint8, user, secret, host, path, query string) {
		ctx := context.Background()
		o := &URLOpener{Broker: NewBroker()}
		for _, open := range []func(*url.URL) error{
			func(u *url.URL) error { _, err := o.OpenTopicURL(ctx, u); return err },
			func(u *url.URL) error { _, err := o.OpenSubscriptionURL(ctx, u); return err },
		} {
			urlfuzz.Check(t, Scheme, where, user, secret, host, path, query, open)
		}
	})
}

// TestURLRules: the rules every scheme shares, on mem://.
func TestURLRules(t *testing.T) {
	ctx := context.Background()
	o := &URLOpener{Broker: NewBroker()}
	for _, raw := range []string{
		"mem:/", "mem:///", "mem:topic", "mem:///x",
		"mem://t?maxkey=%zz", "mem://t?maxkey=1&maxkey=2", "mem://t?maxkey=1;payload=required",
		"mem://t?password=S3CRET", "mem://app:S3CRET@t",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		_, err = o.OpenTopicURL(ctx, u)
		if !errors.Is(err, keyorder.ErrBadURL) || strings.Contains(err.Error(), "S3CRET") {
			t.Errorf("topic %q: %v, want ErrBadURL without the secret", raw, err)
		}
		u.RawQuery += "&subscription=s"
		_, err = o.OpenSubscriptionURL(ctx, u)
		if !errors.Is(err, keyorder.ErrBadURL) || strings.Contains(err.Error(), "S3CRET") {
			t.Errorf("subscription %q: %v, want ErrBadURL without the secret", raw, err)
		}
	}
	u, _ := url.Parse("mem://t?subscription=s&ordering=%zz")
	if _, err := o.OpenSubscriptionURL(ctx, u); err == nil || !strings.Contains(err.Error(), `"ordering"`) {
		t.Errorf("malformed ordering: %v, want an error naming the parameter", err)
	}
}
