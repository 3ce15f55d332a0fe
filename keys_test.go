package keyorder_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/keyorder/keyorder"
)

func TestJoinSplitKey(t *testing.T) {
	cases := [][]string{{}, {""}, {"a"}, {"a", "b"}, {"a/b"}, {"a%2Fb"}, {"", ""}, {"a", ""}, {"", "a"}, {"%"}, {"%", "/", "%25"}, {"tenant-7", "acct-42"}}
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
	// No key is the empty list, a distinct key from the one empty part.
	if k0, k1 := keyorder.JoinKey(), keyorder.JoinKey(""); k0 != "" || k0 == k1 {
		t.Fatalf("JoinKey() = %q, JoinKey(\"\") = %q; want \"\" and a different key", k0, k1)
	}
	for _, bad := range []string{"a%2", "%%", "a%", "%a", "a%2f", "/", "a/", "/a", "a//b"} {
		if parts, err := keyorder.SplitKey(bad); !errors.Is(err, keyorder.ErrBadKeyEncoding) {
			t.Errorf("SplitKey(%q) = %q, %v; want ErrBadKeyEncoding", bad, parts, err)
		}
	}
}

// TestJoinKeyInjective: every list of up to three parts over an alphabet
// of awkward parts (empty, separators, escapes, what they decode to) has
// its own key, and SplitKey returns exactly that list.
func TestJoinKeyInjective(t *testing.T) {
	alphabet := []string{"", "a", "b", "a/b", "/", "%", "%25", "%2F", "a%2Fb", "%/"}
	var lists [][]string
	var grow func(prefix []string, n int)
	grow = func(prefix []string, n int) {
		lists = append(lists, prefix)
		if n == 0 {
			return
		}
		for _, p := range alphabet {
			grow(append(slices.Clip(prefix), p), n-1)
		}
	}
	grow(nil, 3)
	seen := make(map[string][]string, len(lists))
	for _, parts := range lists {
		k := keyorder.JoinKey(parts...)
		if prev, dup := seen[k]; dup {
			t.Fatalf("JoinKey(%q) = JoinKey(%q) = %q", parts, prev, k)
		}
		seen[k] = parts
		if got, err := keyorder.SplitKey(k); err != nil || !slices.Equal(got, parts) || len(got) != len(parts) {
			t.Fatalf("SplitKey(JoinKey(%q)) = %q, %v", parts, got, err)
		}
	}
}

// FuzzJoinSplitKey: SplitKey inverts JoinKey on any part list (parts are
// data cut at 0xff bytes; empty says the list has no parts), and any key
// SplitKey accepts is JoinKey of its parts, so the two are a bijection
// between part lists and encodings: JoinKey is injective.
func FuzzJoinSplitKey(f *testing.F) {
	for _, seed := range []string{"", "a", "a/b", "a\xffb", "\xff", "%", "%25\xff%2F", "a//b", "%/%", "a%2"} {
		f.Add(seed, false)
	}
	f.Add("", true)
	f.Fuzz(func(t *testing.T, data string, empty bool) {
		parts := strings.Split(data, "\xff")
		if empty {
			parts = nil
		}
		k := keyorder.JoinKey(parts...)
		if got, err := keyorder.SplitKey(k); err != nil || len(got) != len(parts) || !slices.Equal(got, parts) {
			t.Fatalf("SplitKey(JoinKey(%q)) = %q, %v", parts, got, err)
		}
		// data as a key: accepted only if it is an encoding, of its parts.
		if got, err := keyorder.SplitKey(data); err == nil {
			if back := keyorder.JoinKey(got...); back != data {
				t.Fatalf("SplitKey(%q) = %q, but JoinKey of that is %q", data, got, back)
			}
		} else if !errors.Is(err, keyorder.ErrBadKeyEncoding) {
			t.Fatalf("SplitKey(%q): %v", data, err)
		}
	})
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
