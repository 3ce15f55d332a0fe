package nats

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/keyorder/keyorder"
)

// TestKeyTokenRoundTrip: every key maps to one legal subject token and
// decodes exactly; a long key maps to a digest and comes back from its
// header.
func TestKeyTokenRoundTrip(t *testing.T) {
	for _, key := range []string{"A", "acct-42", "a.b.c", "with space", "*", ">", "ünï ✓", "\x01\x7f", strings.Repeat("k", 191), strings.Repeat("k", 192), strings.Repeat("x", MaxKeyBytes)} {
		tok, long := keyToken(key)
		if len(tok) > MaxKeyToken+1 || strings.ContainsAny(tok, ". *>\t\r\n") {
			t.Fatalf("key %.20q: token %.40q is not a legal subject token of at most %d bytes", key, tok, MaxKeyToken)
		}
		h := nats.Header{}
		if long {
			h.Set(HeaderKey, key)
		}
		if got := keyFromToken(tok, h); got != key {
			t.Errorf("key %.20q: token %.40q decodes to %.20q", key, tok, got)
		}
		if long != (len(key) > 191) {
			t.Errorf("key of %d bytes: long = %v", len(key), long)
		}
	}
	if tok, _ := keyToken(""); tok != "_" || keyFromToken("_", nats.Header{}) != "" {
		t.Errorf("keyless token %q", tok)
	}
	a, _ := keyToken(strings.Repeat("x", 300))
	b, _ := keyToken(strings.Repeat("x", 299) + "y")
	if a == b {
		t.Error("two long keys share a token")
	}
}

// TestPartitionOfStable: a key's partition depends on the key and the
// count only.
func TestPartitionOfStable(t *testing.T) {
	seen := map[int]bool{}
	for i := range 200 {
		k := "key-" + strings.Repeat("z", i%7) + string(rune('a'+i%26))
		p := partitionOf(k, 8)
		if p != partitionOf(k, 8) || p < 0 || p >= 8 {
			t.Fatalf("partitionOf(%q) = %d", k, p)
		}
		seen[p] = true
	}
	if len(seen) < 6 {
		t.Errorf("200 keys landed on %d of 8 partitions", len(seen))
	}
}

// TestParseURLRejects: bad URLs fail with ErrBadURL naming the problem.
func TestParseURLRejects(t *testing.T) {
	for _, c := range []struct {
		url    string
		forSub bool
		want   string
	}{
		{"nats://h:4222/S", true, "subscription"},
		{"nats://h:4222/a.b?subscription=s", true, "path"},
		{"nats://h:4222/S?subscription=a.b", true, "subscription"},
		{"nats://h:4222/S?subscription=s&lease=10ms", true, "lease"},
		{"nats://h:4222/S?ordering=ordered", false, "ordering"},
		{"nats://h:4222/S?partitions=0&create=true", false, "partitions"},
		{"nats://u:p@h:4222/S", false, "userinfo"},
		{"nats:///S", false, "host"},
	} {
		u, err := url.Parse(c.url)
		if err != nil {
			t.Fatal(err)
		}
		_, err = parseURL(u, c.forSub)
		if !errors.Is(err, keyorder.ErrBadURL) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseURL(%s) = %v; want ErrBadURL naming %s", c.url, err, c.want)
		}
	}
	u, _ := url.Parse("nats://h:4222/S?subscription=s&ordering=exclusive&lease=3s&max_batch=10&max_pending=20&create=true&partitions=3")
	p, err := parseURL(u, true)
	if err != nil || p.sub != "s" || p.subO.Lease.Seconds() != 3 || p.subO.MaxBatch != 10 || p.subO.MaxPending != 20 || !p.create || p.partitions != 3 {
		t.Errorf("parseURL = %+v, %v", p, err)
	}
}

// TestParseURLMsgID: msg_id=off turns the Nats-Msg-Id off on topic URLs;
// a subscription URL, which publishes nothing, refuses it.
func TestParseURLMsgID(t *testing.T) {
	for _, c := range []struct {
		url     string
		forSub  bool
		noMsgID bool
		bad     bool
	}{
		{"nats://h:4222/S", false, false, false},
		{"nats://h:4222/S?msg_id=on", false, false, false},
		{"nats://h:4222/S?msg_id=off", false, true, false},
		{"nats://h:4222/S?msg_id=false&create=true", false, true, false},
		{"nats://h:4222/S?msg_id=maybe", false, false, true},
		{"nats://h:4222/S?subscription=s&msg_id=off", true, false, true},
	} {
		u, err := url.Parse(c.url)
		if err != nil {
			t.Fatal(err)
		}
		p, err := parseURL(u, c.forSub)
		if c.bad {
			if !errors.Is(err, keyorder.ErrBadURL) || !strings.Contains(err.Error(), "msg_id") {
				t.Errorf("parseURL(%s) = %v; want ErrBadURL naming msg_id", c.url, err)
			}
			continue
		}
		if err != nil || p.topicO.NoMsgID != c.noMsgID {
			t.Errorf("parseURL(%s) = %+v, %v; want NoMsgID %v", c.url, p, err, c.noMsgID)
		}
	}
}
