package adapters

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/keyorder/keyorder"
)

func TestRedact(t *testing.T) {
	for raw, want := range map[string]string{
		"postgres://app:PASS@h/db?topic=t":                     "postgres://app:xxxxx@h/db?topic=t",
		"postgres://app@h/db?password=PASS&sslpassword=P2&x=1": "postgres://app@h/db?password=xxxxx&sslpassword=xxxxx&x=1",
		"pulsar://h?authParams=PASS&AUTH_TOKEN=T":              "pulsar://h?authParams=xxxxx&AUTH_TOKEN=xxxxx",
		"sqs://q.fifo?endpoint=http%3A%2F%2Fu%3APASS%40h":      "sqs://q.fifo?endpoint=http%3A%2F%2Fu%3Axxxxx%40h",
		"sqs://q.fifo?pass%zzword=PASS":                        "sqs://q.fifo?xxxxx",
		"mem:u:PASS@t":                                         "mem:xxxxx",
		"mem://t#PASS":                                         "mem://t#xxxxx",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got := Redact(u); got != want {
			t.Errorf("Redact(%q) = %q, want %q", raw, got, want)
		}
	}
}

func TestQuery(t *testing.T) {
	u, _ := url.Parse("x://h?b=2&a=%41&&c=")
	ps, err := Query(u)
	if err != nil || len(ps) != 3 || ps[0] != (Param{"b", "2"}) || ps[1] != (Param{"a", "A"}) || ps[2] != (Param{"c", ""}) {
		t.Fatalf("Query = %v, %v", ps, err)
	}
	for raw, name := range map[string]string{
		"x://h?a=%zz":    `"a"`,
		"x://h?a=1&a=2":  `"a"`,
		"x://h?a=1;b=2":  `"a"`,
		"x://h?%zz=1":    `"%zz"`,
		"x://h?=1":       `""`,
		"x://h?password": "",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Query(u)
		if name == "" {
			if err != nil {
				t.Errorf("Query(%q) = %v, want nil", raw, err)
			}
			continue
		}
		if !errors.Is(err, keyorder.ErrBadURL) || !strings.Contains(err.Error(), "parameter "+name) {
			t.Errorf("Query(%q) = %v, want ErrBadURL naming %s", raw, err, name)
		}
	}
}

func TestParseURLNeverEchoes(t *testing.T) {
	for _, raw := range []string{"pg://u:PASS@h:%zz/", "pg://u:PASS@h:x/", "pg://h/%zzPASS", "pg://h?x=1#PASS"} {
		_, err := ParseURL(raw)
		if !errors.Is(err, keyorder.ErrBadURL) || strings.Contains(err.Error(), "PASS") {
			t.Errorf("ParseURL(%q) = %v, want ErrBadURL without the secret", raw, err)
		}
	}
}
