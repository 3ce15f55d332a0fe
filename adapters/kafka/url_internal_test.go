package kafka

import (
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/policy"
)

// TestURLParse: brokers from the host part, topic from the path, the
// subscription parameters, and the defaults.
func TestURLParse(t *testing.T) {
	u, err := url.Parse("kafka://b1:9092,b2:9093/orders.v1?group=g&lease=5s&session_timeout=10s&max_batch=7&max_pending=99&max_message_size=2000000&client_id=svc")
	if err != nil {
		t.Fatal(err)
	}
	p, err := parseURL(u, true)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.brokers, []string{"b1:9092", "b2:9093"}) || p.topic != "orders.v1" || p.group != "g" {
		t.Errorf("parsed %v %q %q", p.brokers, p.topic, p.group)
	}
	o := p.subO
	if o.Ordering != policy.Ordered || o.Lease != 5*time.Second || o.SessionTimeout != 10*time.Second ||
		o.MaxBatch != 7 || o.MaxPending != 99 || o.MaxMessageBytes != 2000000 || p.topicO.MaxMessageBytes != 2000000 {
		t.Errorf("options %+v", o)
	}
	if p.create || p.partitions != -1 {
		t.Errorf("create %v partitions %d without create=; want false, -1", p.create, p.partitions)
	}
	u, _ = url.Parse("kafka://b1:9092/t?create=true&partitions=12")
	if p, err := parseURL(u, false); err != nil || !p.create || p.partitions != 12 {
		t.Errorf("create=true&partitions=12: %+v, %v", p, err)
	}
	u, _ = url.Parse("kafka://b1:9092/t?group=g&create=true")
	if p, err := parseURL(u, true); err != nil || !p.create || p.partitions != -1 {
		t.Errorf("create=true on a subscription: %+v, %v", p, err)
	}
	u, _ = url.Parse("kafka://b1:9092/t?group=g&ordering=exclusive")
	if p, err := parseURL(u, true); err != nil || p.subO.Ordering != policy.Exclusive {
		t.Errorf("ordering=exclusive: %v, %v", p, err)
	}
}

// TestURLErrors: every malformed URL is ErrBadURL naming its parameter,
// and no error echoes a secret.
func TestURLErrors(t *testing.T) {
	for _, tc := range []struct {
		raw    string
		forSub bool
		param  string
	}{
		{"kafka:///t?group=g", true, "host"},
		{"kafka://b1/t?group=g", true, "host"},
		{"kafka://b1,b2:9092/t?group=g", true, "host"},
		{"kafka://b1:9092/?group=g", true, "path"},
		{"kafka://b1:9092/a/b?group=g", true, "path"},
		{"kafka://b1:9092/a%20b?group=g", true, "path"},
		{"kafka://b1:9092/t", true, "group"},
		{"kafka://b1:9092/t?group=g", false, "group"},
		{"kafka://b1:9092/t?group=g&ordering=fifo", true, "ordering"},
		{"kafka://b1:9092/t?group=g&lease=10ms", true, "lease"},
		{"kafka://b1:9092/t?group=g&max_batch=0", true, "max_batch"},
		{"kafka://b1:9092/t?group=g&max_message_size=100", true, "max_message_size"},
		{"kafka://b1:9092/t?group=g&bogus=s3cr3t", true, "bogus"},
		{"kafka://b1:9092/t?create=maybe", false, "create"},
		{"kafka://b1:9092/t?partitions=3", false, "partitions"},
		{"kafka://b1:9092/t?create=true&partitions=0", false, "partitions"},
		{"kafka://b1:9092/t?create=true&partitions=100000", false, "partitions"},
		{"kafka://,b1:9092/t?group=g", true, "host"},
		{"kafka://b1:0/t?group=g", true, "host"},
		{"kafka://b1:x,b2:9092/t?group=g", true, "host"},
		{"kafka://:9092/t?group=g", true, "host"},
		{"kafka://b1:9092?group=g", true, "path"},
		{"kafka://b1:9092/" + strings.Repeat("t", 250) + "?group=g", true, "path"},
		{"kafka://b1:9092/..?group=g", true, "path"},
		{"kafka://b1:9092/t?group=", true, "group"},
		{"kafka://b1:9092/t?group=g&ordering=bogus", true, "ordering"},
		{"kafka://b1:9092/t?group=ops%20blue", true, "group"},
		{"kafka://b1:9092/t?group=ops:blue", true, "group"},
		{"kafka://b1:9092/t?group=" + strings.Repeat("g", 243), true, "group"},
		{"kafka://b1:9092/t?ordering=ordered", false, "ordering"},
		{"kafka://b1:9092/t?group=g&session_timeout=x", true, "session_timeout"},
		{"kafka://b1:9092/t?group=g&max_pending=-1", true, "max_pending"},
		{"kafka://b1:9092/t?max_message_size=3000000000", false, "max_message_size"},
		{"kafka://b1:9092/t?max_message_size=abc", false, "max_message_size"},
		{"kafka://b1:9092/t?create=true&partitions=-1", false, "partitions"},
		{"kafka://b1:9092/t?create=true&partitions=abc", false, "partitions"},
		{"kafka://b1:9092/t?group=g&group=h", true, "group"},
		{"kafka://b1:9092/t?group=g&password=s3cr3t", true, "password"},
		{"kafka://b1:9092/t?group=g&sasl_password=s3cr3t", true, "sasl_password"},
		{"kafka://b1:9092/t?group=g&sasl_user=u&sasl_mechanism=PLAIN", true, "sasl_user"},
		{"kafka://u@b1:9092/t?group=g", true, "userinfo"},
		{"kafka://u:s3cr3t@b1:9092/t?group=g", true, "userinfo"},
	} {
		u, err := url.Parse(tc.raw)
		if err != nil {
			t.Fatalf("%s: %v", tc.raw, err)
		}
		_, err = parseURL(u, tc.forSub)
		if !errors.Is(err, keyorder.ErrBadURL) || !strings.Contains(err.Error(), tc.param) || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: %v, want ErrBadURL about %s without the secret", tc.raw, err, tc.param)
		}
	}
}
