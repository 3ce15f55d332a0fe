package pulsar

import (
	"errors"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/policy"
)

// TestURLSecretParams: a misspelled or unread secret-looking parameter, the
// token and the userinfo password are never echoed, whichever parameter
// the error is about.
func TestURLSecretParams(t *testing.T) {
	for _, p := range []string{"pasword", "passwd", "secret_key", "access_token", "apikey", "sessiontoken", "private_key", "authparams", "bogus"} {
		for _, raw := range []string{
			"pulsar://h:6650/a/b/t?subscription=s&" + p + "=s3cr3t",
			"pulsar://u:s3cr3t@h:6650/a/b/t?token=s3cr3t&" + p + "=s3cr3t&subscription=s&lease=x",
			"pulsar://h:6650/a/b/t?subscription=s&lease=x&" + p + "=s3cr3t",
		} {
			u, err := url.Parse(raw)
			if err != nil {
				t.Fatal(err)
			}
			_, serr := parseURL(u, true)
			_, terr := parseURL(u, false)
			for _, err := range []error{serr, terr} {
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
	parse := func(q string) (*parsed, error) {
		u, _ := url.Parse("pulsar://h:6650/a/b/t?subscription=s&lease=5s&" + q)
		return parseURL(u, true)
	}
	oldP, err1 := parse("receiverqueue=10&maxbatch=5&maxmessagesize=1000000&tlscafile=/ca&tlsallowinsecure=true&tlsvalidatehostname=true&tlscertfile=/c&tlskeyfile=/k")
	newP, err2 := parse("receiver_queue=10&max_batch=5&max_message_size=1000000&tls_ca_file=/ca&tls_allow_insecure=true&tls_validate_hostname=true&tls_cert_file=/c&tls_key_file=/k")
	if err1 != nil || err2 != nil {
		t.Fatalf("old: %v, new: %v", err1, err2)
	}
	if !reflect.DeepEqual(oldP.subO, newP.subO) || oldP.topicO != newP.topicO ||
		oldP.client.TLSTrustCertsFilePath != newP.client.TLSTrustCertsFilePath || oldP.client.TLSAllowInsecureConnection != newP.client.TLSAllowInsecureConnection ||
		oldP.client.TLSValidateHostname != newP.client.TLSValidateHostname || (oldP.client.Authentication == nil) != (newP.client.Authentication == nil) {
		t.Errorf("old %+v, new %+v: want the same", oldP, newP)
	}
	if newP.subO.ReceiverQueueSize != 10 || newP.subO.MaxBatch != 5 || newP.topicO.MaxMessageBytes != 1000000 || newP.subO.Lease != 5*time.Second ||
		newP.client.TLSTrustCertsFilePath != "/ca" || !newP.client.TLSAllowInsecureConnection || newP.client.Authentication == nil {
		t.Errorf("new spellings not applied: %+v", newP)
	}
	if newP.subO.Ordering != policy.Ordered {
		t.Errorf("default ordering %v, want ordered", newP.subO.Ordering)
	}
	for _, q := range []string{"tokenfile=/t", "token_file=/t"} {
		if p, err := parse(q); err != nil || p.client.Authentication == nil {
			t.Errorf("%s: %v, want a token authentication", q, err)
		}
	}
	for _, q := range []string{"maxbatch=5&max_batch=5", "receiverqueue=1&receiver_queue=1", "tokenfile=/t&token_file=/t", "tlscafile=/a&tls_ca_file=/a"} {
		if _, err := parse(q); !errors.Is(err, keyorder.ErrBadURL) || !strings.Contains(err.Error(), "given twice") {
			t.Errorf("%s: %v, want ErrBadURL (given twice)", q, err)
		}
	}
}
