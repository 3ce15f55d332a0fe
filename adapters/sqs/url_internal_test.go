package sqs

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/internal/urlfuzz"
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
