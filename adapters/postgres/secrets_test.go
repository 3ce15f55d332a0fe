package postgres_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	kopublish "github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// TestURLSecretsAndCodes, on the real server: whatever fails, the password
// of the URL never appears in the error, and the error carries the code the
// docs promise.
func TestURLSecretsAndCodes(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u, err := url.Parse(e.url)
	if err != nil {
		t.Fatal(err)
	}
	user := "keyorder"
	if u.User != nil {
		user = u.User.Username()
	}
	u.User = url.UserPassword(user, "S3CRETpw")
	withQuery := func(q string) string {
		c := *u
		if c.RawQuery != "" {
			q = c.RawQuery + "&" + q
		}
		c.RawQuery = q
		return c.String()
	}
	for _, tc := range []struct {
		url  string
		code keyorder.ErrorCode
	}{
		{withQuery("schema=" + e.schema + "&topic=t&bogus=1"), keyorder.CodeInvalidArgument},
		{withQuery("schema=" + e.schema + "&topic=t&ordering=%zz"), keyorder.CodeInvalidArgument},
		{withQuery("schema=" + e.schema + "&topic=t&password=S3CRETpw"), keyorder.CodeInvalidArgument},
		{withQuery("schema=" + e.schema + "&topic=nope&subscription=s"), keyorder.CodeNotFound},
	} {
		_, perr := kopublish.Open(ctx, tc.url, nil)
		_, serr := subscribe.Open(ctx, tc.url, nil)
		for _, err := range []error{perr, serr} {
			if err == nil || strings.Contains(err.Error(), "S3CRETpw") || keyorder.Code(err) != tc.code {
				t.Errorf("%s: %v (code %v), want code %v without the password", strings.ReplaceAll(tc.url, "S3CRETpw", "xxxxx"), err, keyorder.Code(err), tc.code)
			}
		}
		if tc.code == keyorder.CodeNotFound && !errors.Is(perr, keyorder.ErrNotFound) {
			t.Errorf("missing topic: %v, want ErrNotFound", perr)
		}
	}
}
