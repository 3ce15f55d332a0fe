package postgres

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/internal/urlfuzz"
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
