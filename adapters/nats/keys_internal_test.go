package nats

import (
	"errors"
	"hash/fnv"
	"net/url"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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

// TestSubjectsAsBefore: the subject built in place is
// <stream>.<partition>.<keyToken(key)>, and the partition is still the
// FNV-1a of hash/fnv (streams written before keep their keys' partitions).
func TestSubjectsAsBefore(t *testing.T) {
	for _, key := range []string{"", "A", "acct-42", "ünï ✓", strings.Repeat("k", 191), strings.Repeat("k", 192), strings.Repeat("x", MaxKeyBytes)} {
		h := fnv.New32a()
		h.Write([]byte(key))
		want := int(h.Sum32() % 7)
		if got := partitionOf(key, 7); got != want {
			t.Errorf("partitionOf(%.20q, 7) = %d, hash/fnv gives %d", key, got, want)
		}
		tok, long := keyToken(key)
		b, gotLong := appendSubject([]byte("x"), "S", 3, key)
		if string(b) != "xS.3."+tok || gotLong != long {
			t.Errorf("appendSubject(%.20q) = %.60q, %v; want %.60q, %v", key, b, gotLong, "xS.3."+tok, long)
		}
	}
}

// TestParseReply: acknowledgement subjects <prefix><batch>.<index>, and
// nothing else.
func TestParseReply(t *testing.T) {
	const pre = "_INBOX.abc."
	for subj, want := range map[string][2]uint64{pre + "1.0": {1, 0}, pre + "42.999": {42, 999}, pre + "9999999999999999999.7": {9999999999999999999, 7}} {
		id, i, ok := parseReply(subj, len(pre))
		if !ok || id != want[0] || uint64(i) != want[1] {
			t.Errorf("parseReply(%q) = %d, %d, %v; want %v", subj, id, i, ok, want)
		}
	}
	for _, subj := range []string{pre, pre + "1", pre + "1.", pre + ".1", pre + "1.2.3", pre + "a.1", pre + "1.x", pre + "1.12345678901"} {
		if _, _, ok := parseReply(subj, len(pre)); ok {
			t.Errorf("parseReply(%q) accepted it", subj)
		}
	}
}

// TestAckError: a plain acknowledgement is success, a duplicate too; the
// server's error is its *jetstream.APIError; no responders and garbage are
// typed errors.
func TestAckError(t *testing.T) {
	ok := []string{`{"stream":"S","seq":12}`, `{"stream":"S","seq":3,"duplicate":true}`, `{"stream":"error","seq":1}`, `{"seq":5,"stream":"S"}`, `{"stream":"S","domain":"d","seq":1}`}
	for _, d := range ok {
		if err := ackError(&nats.Msg{Data: []byte(d)}); err != nil {
			t.Errorf("ack %s: %v", d, err)
		}
	}
	err := ackError(&nats.Msg{Data: []byte(`{"error":{"code":400,"err_code":10054,"description":"message size exceeds maximum allowed"}}`)})
	var api *jetstream.APIError
	if !errors.As(err, &api) || api.ErrorCode != 10054 {
		t.Errorf("error ack: %v", err)
	}
	if err := ackError(&nats.Msg{Header: nats.Header{"Status": []string{"503"}}}); !errors.Is(err, jetstream.ErrNoStreamResponse) || !isRetryable(err) {
		t.Errorf("no responders: %v", err)
	}
	for _, d := range []string{`{}`, `not json`, `{"stream":""}`} {
		if err := ackError(&nats.Msg{Data: []byte(d)}); !errors.Is(err, jetstream.ErrInvalidJSAck) {
			t.Errorf("ack %s: %v, want ErrInvalidJSAck", d, err)
		}
	}
}
