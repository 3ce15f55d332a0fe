package driver

import (
	"context"
	"errors"
	"net/url"
	"testing"

	"github.com/keyorder/keyorder"
)

type opener struct{ got *url.URL }

func (o *opener) OpenTopicURL(_ context.Context, u *url.URL) (Topic, error) {
	o.got = u
	return nil, nil
}

func TestRegistry(t *testing.T) {
	m := &URLMux{}
	o := &opener{}
	m.RegisterTopic("x", o)
	if _, err := m.OpenTopic(context.Background(), "x://t?a=1"); err != nil || o.got.Host != "t" {
		t.Fatalf("OpenTopic: %v, %v", err, o.got)
	}
	_, err := m.OpenTopic(context.Background(), "y://t")
	if !errors.Is(err, keyorder.ErrUnknownScheme) {
		t.Fatalf("unknown scheme: %v", err)
	}
	for _, bad := range []string{"://nope", "no-scheme", "x://%zz"} {
		if _, err := m.OpenTopic(context.Background(), bad); !errors.Is(err, keyorder.ErrBadURL) {
			t.Errorf("OpenTopic(%q) = %v, want ErrBadURL", bad, err)
		}
	}
	if _, err := m.OpenSubscription(context.Background(), "x://t"); !errors.Is(err, keyorder.ErrUnknownScheme) {
		t.Fatalf("subscription scheme not registered: %v", err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("duplicate registration did not panic")
			}
		}()
		m.RegisterTopic("x", o)
	}()
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("nil opener did not panic")
			}
		}()
		m.RegisterSubscription("z", nil)
	}()
}
