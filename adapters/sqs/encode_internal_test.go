package sqs

import (
	"bytes"
	"errors"
	"log/slog"
	"maps"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// FuzzGroupID: every key maps to a valid group, and no two keys (nor a key
// and a keyless message) share one.
func FuzzGroupID(f *testing.F) {
	digest := GroupID("a key with spaces")
	for _, seed := range [][2]string{
		{"acct-42", "acct-43"}, {"a key with spaces", digest}, {"", "h-"}, {"m-x", "x"},
		{strings.Repeat("k", 128), strings.Repeat("k", 129)}, {"é", "\xff"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ga, gb := GroupID(a), GroupID(b)
		for _, g := range []string{ga, gb} {
			if len(g) == 0 || len(g) > 128 {
				t.Fatalf("group %q: want 1 to 128 characters", g)
			}
			for i := 0; i < len(g); i++ {
				if !groupAlphabet(g[i]) {
					t.Fatalf("group %q: byte %q outside SQS's alphabet", g, g[i])
				}
			}
			if strings.HasPrefix(g, "m-") {
				t.Fatalf("key group %q looks like a keyless message's group", g)
			}
		}
		if a != b && ga == gb {
			t.Fatalf("keys %q and %q share group %q", a, b, ga)
		}
	})
}

// roundTrip encodes m as the topic does and decodes what SQS would return.
func roundTrip(t *testing.T, m *driver.Message) *driver.Message {
	t.Helper()
	e, err := encode(m, policy.Ordered)
	if err != nil {
		t.Fatalf("encode after Validate accepted: %v", err)
	}
	for k, v := range e.attrs {
		if aws.ToString(v.StringValue) == "" && len(v.BinaryValue) == 0 {
			t.Fatalf("attribute %q is empty: SQS refuses it", k)
		}
	}
	rm := &types.Message{
		Body:              aws.String(e.body),
		MessageAttributes: e.attrs,
		MessageId:         aws.String("sqs-id"),
		ReceiptHandle:     aws.String("r"),
		Attributes: map[string]string{
			string(types.MessageSystemAttributeNameMessageGroupId):          e.group,
			string(types.MessageSystemAttributeNameApproximateReceiveCount): "1",
		},
	}
	return (&Subscription{book: &book{n: map[string]int{}}, log: slog.New(slog.DiscardHandler)}).decode(rm, false)
}

// FuzzEncodeDecode: a message Validate accepts is encoded without error and
// decodes to the same ID, key, payload and headers, byte for byte.
func FuzzEncodeDecode(f *testing.F) {
	f.Add("id-1", "acct-42", []byte("hello"), "h", "v")
	f.Add("", "k", []byte{0, 0xff, 0xfe, '\n'}, "x-a", "tab\there\x01")
	f.Add("0190-uuid", "ключ", []byte("\x00"), "n", "")
	f.Add("id", "k", []byte("p"), "empty", "")
	lim := (&Topic{}).Limits()
	f.Fuzz(func(t *testing.T, id, key string, payload []byte, hname, hval string) {
		m := &driver.Message{ID: id, Key: key, Payload: payload}
		if hname != "" {
			m.Headers = map[string]string{hname: hval}
		}
		if err := driver.Validate(lim, m); err != nil {
			var le *keyorder.LimitError
			if !errors.As(err, &le) {
				t.Fatalf("Validate: %v, want a LimitError", err)
			}
			return
		}
		if m.ID == "" {
			m.ID = "00000000-0000-7000-8000-000000000000"
		}
		got := roundTrip(t, m)
		if got.ID != m.ID || got.Key != m.Key || !bytes.Equal(got.Payload, m.Payload) || !maps.Equal(got.Headers, m.Headers) {
			t.Fatalf("round trip changed the message:\n sent %q %q %q %q\n got  %q %q %q %q", m.ID, m.Key, m.Payload, m.Headers, got.ID, got.Key, got.Payload, got.Headers)
		}
	})
}

// TestBinaryPayloadLimit measures the largest binary payload SQS takes
// with a UUID ID, a short key and no headers, and checks that one byte more
// is a LimitError naming the encoded size.
func TestBinaryPayloadLimit(t *testing.T) {
	lim := (&Topic{}).Limits()
	msg := func(n int) *driver.Message {
		return &driver.Message{ID: "0190c6a4-7d1e-7c3b-9a1e-1234567890ab", Key: "acct-42", Payload: bytes.Repeat([]byte{0xff}, n)}
	}
	lo, hi := 1, MaxPayloadBytes
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if driver.Validate(lim, msg(mid)) == nil {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	t.Logf("largest binary payload: %d bytes (base64 body %d of %d)", lo, (lo+2)/3*4, MaxMessageBytes)
	if lo < 196_000 || lo > 196_608 {
		t.Errorf("largest binary payload %d, the package doc says about 196,500", lo)
	}
	var le *keyorder.LimitError
	if err := driver.Validate(lim, msg(lo+3)); !errors.As(err, &le) || !strings.HasPrefix(le.Limit, "encoded size") || le.Max != MaxMessageBytes {
		t.Errorf("one base64 quantum over: %v, want a LimitError on the encoded size", err)
	}
	got := roundTrip(t, msg(lo))
	if !bytes.Equal(got.Payload, msg(lo).Payload) {
		t.Error("the largest binary payload did not round-trip")
	}
}
