package keyorder_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/keyorder/keyorder"
)

func TestJoinSplitKey(t *testing.T) {
	cases := [][]string{{"a"}, {"a", "b"}, {"a/b"}, {"a%2Fb"}, {"", ""}, {"%", "/", "%25"}, {"tenant-7", "acct-42"}}
	seen := map[string][]string{}
	for _, parts := range cases {
		k := keyorder.JoinKey(parts...)
		if prev, dup := seen[k]; dup {
			t.Fatalf("JoinKey(%q) = JoinKey(%q) = %q", parts, prev, k)
		}
		seen[k] = parts
		got, err := keyorder.SplitKey(k)
		if err != nil || !slices.Equal(got, parts) {
			t.Fatalf("SplitKey(%q) = %q, %v; want %q", k, got, err, parts)
		}
	}
	if k := keyorder.JoinKey("tenant-7", "acct-42"); k != "tenant-7/acct-42" {
		t.Fatalf("plain parts: %q", k)
	}
	if _, err := keyorder.SplitKey("a%2"); !errors.Is(err, keyorder.ErrBadKeyEncoding) {
		t.Fatalf("bad escape: %v", err)
	}
}

func TestCompositeKey(t *testing.T) {
	kf := keyorder.CompositeKey(keyorder.FairnessKeyPart(), keyorder.HeaderPart("account"))
	m := &keyorder.Message{Headers: map[string]string{keyorder.HeaderFairnessKey: "t7", "account": "a/42"}}
	if k, err := kf(m); err != nil || k != "t7/a%2F42" {
		t.Fatalf("got %q, %v", k, err)
	}
	_, err := kf(&keyorder.Message{Headers: map[string]string{keyorder.HeaderFairnessKey: "t7"}})
	var mk *keyorder.MissingKeyError
	if !errors.Is(err, keyorder.ErrMissingKey) || !errors.As(err, &mk) || mk.Part != `header "account"` {
		t.Fatalf("missing part: %v", err)
	}
	if _, err := kf(&keyorder.Message{Headers: map[string]string{"account": "1", keyorder.HeaderFairnessKey: ""}}); !errors.As(err, &mk) || mk.Part != "fairness key" {
		t.Fatalf("empty fairness key: %v", err)
	}
	if k, err := keyorder.KeyFromHeaders("x", "y")(&keyorder.Message{Headers: map[string]string{"x": "1", "y": "2"}}); k != "1/2" || err != nil {
		t.Fatalf("KeyFromHeaders: %q %v", k, err)
	}
	if k, err := keyorder.CompositeKey()(&keyorder.Message{}); k != "" || err != nil {
		t.Fatalf("no parts: %q %v", k, err)
	}
}
