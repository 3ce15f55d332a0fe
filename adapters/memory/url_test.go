package memory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/urlfuzz"
	"github.com/keyorder/keyorder/policy"
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

// secretParams are misspelled or unread parameters that may hold a secret:
// no error may echo their value.
var secretParams = []string{"pasword", "password", "secret_key", "access_token", "apikey", "sessiontoken", "private_key", "bogus"}

// TestURLSecretParams: whatever parameter holds the secret, and whichever
// parameter the error is about, the secret is not echoed; nor is the
// userinfo password.
func TestURLSecretParams(t *testing.T) {
	ctx := context.Background()
	o := &URLOpener{Broker: NewBroker()}
	for _, p := range secretParams {
		for _, raw := range []string{
			"mem://t?" + p + "=s3cr3t",
			"mem://t?max_key=-1&" + p + "=s3cr3t",
			"mem://t?" + p + "=s3cr3t&max_key=-1",
			"mem://u:s3cr3t@t?" + p + "=s3cr3t",
		} {
			u, err := url.Parse(raw)
			if err != nil {
				t.Fatal(err)
			}
			_, terr := o.OpenTopicURL(ctx, u)
			u.RawQuery += "&subscription=s"
			_, serr := o.OpenSubscriptionURL(ctx, u)
			for _, err := range []error{terr, serr} {
				if !errors.Is(err, keyorder.ErrBadURL) || strings.Contains(err.Error(), "s3cr3t") {
					t.Errorf("%q: %v, want ErrBadURL without the secret", raw, err)
				}
			}
		}
	}
}

// TestURLSpellings: the snake_case spellings and the old ones configure the
// same; both together are an error; ordering defaults to Ordered.
func TestURLSpellings(t *testing.T) {
	ctx := context.Background()
	o := &URLOpener{Broker: NewBroker()}
	open := func(raw string) (driver.Capabilities, error) {
		u, _ := url.Parse(raw)
		d, err := o.OpenSubscriptionURL(ctx, u)
		if err != nil {
			return driver.Capabilities{}, err
		}
		return d.Capabilities(), nil
	}
	oldC, err1 := open("mem://t?subscription=old&maxbatch=7")
	newC, err2 := open("mem://t?subscription=new&max_batch=7")
	if err1 != nil || err2 != nil || oldC.MaxBatch != 7 || newC.MaxBatch != 7 {
		t.Errorf("maxbatch %v %v, max_batch %v %v; want 7 for both", oldC.MaxBatch, err1, newC.MaxBatch, err2)
	}
	if oldC.Ordering != policy.Ordered || newC.Ordering != policy.Ordered {
		t.Errorf("default ordering %v, %v; want ordered", oldC.Ordering, newC.Ordering)
	}
	if _, err := open("mem://t?subscription=both&maxbatch=7&max_batch=7"); !errors.Is(err, keyorder.ErrBadURL) || !strings.Contains(err.Error(), `"max_batch"`) {
		t.Errorf("both spellings: %v, want ErrBadURL naming max_batch", err)
	}
	for _, q := range [][2]string{{"maxkey=9&maxpayload=99", "max_key=9&max_payload=99"}} {
		var lims []driver.Limits
		for i, qq := range q {
			u, _ := url.Parse(fmt.Sprintf("mem://topic%d?%s", i, qq))
			d, err := o.OpenTopicURL(ctx, u)
			if err != nil {
				t.Fatalf("%s: %v", qq, err)
			}
			lims = append(lims, d.(*topicDriver).Limits())
		}
		if lims[0].MaxKeyBytes != lims[1].MaxKeyBytes || lims[0].MaxPayloadBytes != lims[1].MaxPayloadBytes || lims[0].MaxKeyBytes != 9 || lims[0].MaxPayloadBytes != 99 {
			t.Errorf("%s → %+v, %s → %+v; want the same, 9 and 99", q[0], lims[0], q[1], lims[1])
		}
	}
	u, _ := url.Parse("mem://t?maxkey=1&max_key=2")
	if _, err := o.OpenTopicURL(ctx, u); !errors.Is(err, keyorder.ErrBadURL) {
		t.Errorf("both spellings on a topic: %v, want ErrBadURL", err)
	}
}

// TestURLDeprecationWarning: opening through the mux with old spellings
// logs one warning naming them (and no secret); current spellings log
// none.
func TestURLDeprecationWarning(t *testing.T) {
	var buf bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	defer slog.SetDefault(prev)
	ctx := context.Background()
	mux := &driver.URLMux{}
	o := &URLOpener{Broker: NewBroker()}
	mux.RegisterTopic(Scheme, o)
	mux.RegisterSubscription(Scheme, o)
	if _, err := mux.OpenSubscription(ctx, "mem://u:s3cr3t@t?subscription=s&maxbatch=3&chain=2"); err == nil {
		t.Fatal("userinfo accepted")
	}
	if strings.Contains(buf.String(), "s3cr3t") {
		t.Errorf("the warning shows the password:\n%s", buf.String())
	}
	buf.Reset()
	if _, err := mux.OpenSubscription(ctx, "mem://t?subscription=s&maxbatch=3&chain=2"); err != nil {
		t.Fatal(err)
	}
	if _, err := mux.OpenTopic(ctx, "mem://t?maxkey=9&maxpayload=99"); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if strings.Count(out, "level=WARN") != 2 || !strings.Contains(out, "maxbatch (now max_batch)") ||
		!strings.Contains(out, "maxkey (now max_key), maxpayload (now max_payload)") {
		t.Errorf("want one warning per Open naming the old spellings, got:\n%s", out)
	}
	buf.Reset()
	if _, err := mux.OpenSubscription(ctx, "mem://t?subscription=s&max_batch=3&chain=2"); err != nil {
		t.Fatal(err)
	}
	if buf.Len() != 0 {
		t.Errorf("current spellings logged:\n%s", buf.String())
	}
}
