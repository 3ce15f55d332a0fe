package pubsub

import (
	"bytes"
	"errors"
	"log/slog"
	"maps"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/proto"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
)

// FuzzEncodeDecode: a message Validate accepts is converted, marshalled to
// the wire (proto3 strings must be UTF-8: what Pub/Sub would refuse) and
// decoded to the same ID, key, payload and headers, byte for byte.
func FuzzEncodeDecode(f *testing.F) {
	f.Add("id-1", "acct-42", []byte("hello"), "h", "v")
	f.Add("", "k", []byte{0, 0xff, 0xfe, '\n'}, "x-a", "tab\there\x01")
	f.Add("0190-uuid", "ключ", []byte("\x00"), "n", "")
	f.Add("id", "k", []byte("p"), "googx", "reserved")
	f.Add("id", "k", []byte("p"), "a", "\xff")
	lim := (&Topic{}).Limits()
	f.Fuzz(func(t *testing.T, id, key string, payload []byte, hname, hval string) {
		m := &driver.Message{ID: id, Key: key, Payload: payload}
		if hname != "" {
			m.Headers = map[string]string{hname: hval}
		}
		if err := driver.Validate(lim, m); err != nil {
			if !errors.As(err, new(*keyorder.LimitError)) {
				t.Fatalf("Validate: %v, want a LimitError", err)
			}
			return
		}
		if m.ID == "" {
			m.ID = "00000000-0000-7000-8000-000000000000"
		}
		gm, err := toPubSub(m)
		if err != nil {
			t.Fatalf("toPubSub after Validate accepted: %v", err)
		}
		wire, err := proto.Marshal(&pubsubpb.PubsubMessage{Data: gm.Data, Attributes: gm.Attributes, OrderingKey: gm.OrderingKey})
		if err != nil {
			t.Fatalf("the wire refuses a message Validate accepted: %v", err)
		}
		var pm pubsubpb.PubsubMessage
		if err := proto.Unmarshal(wire, &pm); err != nil {
			t.Fatal(err)
		}
		got := (&Subscription{log: slog.New(slog.DiscardHandler)}).fromMessage(&pm)
		if len(m.Payload) == 0 && len(got.Payload) == 0 {
			got.Payload = m.Payload
		}
		if got.ID != m.ID || got.Key != m.Key || !bytes.Equal(got.Payload, m.Payload) || !maps.Equal(got.Headers, m.Headers) {
			t.Fatalf("round trip changed the message:\n sent %q %q %q %q\n got  %q %q %q %q", m.ID, m.Key, m.Payload, m.Headers, got.ID, got.Key, got.Payload, got.Headers)
		}
	})
}
