package sqs

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
	urlfuzz.Seed(f, "endpoint=http://127.0.0.1:9324", "endpoint=%zz", "region=a&region=b", "ordering=%zz", "visibility=30s&wait=1s&oldestfirst=true")
	f.Add(uint8(0), "", "", "q.fifo", "", "endpoint=http://127.0.0.1:9324&region=eu-west-1")
	f.Fuzz(func(t *testing.T, where uint8, user, secret, host, path, query string) {
		urlfuzz.Check(t, Scheme, where, user, secret, host, path, query, func(u *url.URL) error {
			_, err := parseURL(u)
			return err
		})
	})
}

func TestURLSecrets(t *testing.T) {
	for _, raw := range []string{
		"sqs://app:S3CRET@q.fifo",
		"sqs://q.fifo?aws_secret_access_key=S3CRET",
		"sqs://q.fifo?endpoint=http://u:S3CRET@127.0.0.1:9324&bogus=1",
		"sqs://q.fifo?endpoint=%zz",
		"sqs://q.fifo?ordering=%zz",
		"sqs://q.fifo?region=a&region=b",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		_, err = parseURL(u)
		if !errors.Is(err, keyorder.ErrBadURL) || strings.Contains(err.Error(), "S3CRET") {
			t.Errorf("%q: %v, want ErrBadURL without the secret", raw, err)
		}
	}
}

// TestURLSecretParams: a misspelled or unread secret-looking parameter is
// never echoed, whichever parameter the error is about.
func TestURLSecretParams(t *testing.T) {
	for _, p := range []string{"pasword", "passwd", "secret_key", "access_token", "apikey", "sessiontoken", "aws_session_token", "private_key", "bogus"} {
		for _, raw := range []string{
			"sqs://q.fifo?" + p + "=s3cr3t",
			"sqs://q.fifo?" + p + "=s3cr3t&lease=x",
			"sqs://q.fifo?lease=x&" + p + "=s3cr3t",
		} {
			u, err := url.Parse(raw)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := parseURL(u); !errors.Is(err, keyorder.ErrBadURL) || strings.Contains(err.Error(), "s3cr3t") {
				t.Errorf("%q: %v, want ErrBadURL without the secret", raw, err)
			}
		}
	}
}

// TestURLSpellings: lease and oldest_first and the old spellings visibility
// and oldestfirst configure the same; both together are an error;
// ordering defaults to Ordered.
func TestURLSpellings(t *testing.T) {
	parse := func(q string) (Options, error) {
		u, _ := url.Parse("sqs://q.fifo?" + q)
		c, err := parseURL(u)
		if err != nil {
			return Options{}, err
		}
		return c.opts, nil
	}
	oldO, err1 := parse("visibility=20s&oldestfirst=true")
	newO, err2 := parse("lease=20s&oldest_first=true")
	if err1 != nil || err2 != nil || oldO.Lease != newO.Lease || oldO.OldestFirst != newO.OldestFirst || newO.Lease != 20*time.Second || !newO.OldestFirst {
		t.Errorf("old %+v %v, new %+v %v; want the same, 20s and oldest first", oldO, err1, newO, err2)
	}
	if newO.Ordering != policy.Ordered {
		t.Errorf("default ordering %v, want ordered", newO.Ordering)
	}
	for _, q := range []string{"visibility=20s&lease=20s", "oldest_first=true&oldestfirst=true"} {
		if _, err := parse(q); !errors.Is(err, keyorder.ErrBadURL) || !strings.Contains(err.Error(), "given twice") {
			t.Errorf("%s: %v, want ErrBadURL (given twice)", q, err)
		}
	}
}
