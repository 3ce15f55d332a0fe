package nats_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyorder/keyorder"
	kn "github.com/keyorder/keyorder/adapters/nats"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/subscribe"
)

// newStream creates a keyorder stream of 2 partitions with cfg's
// max_msg_size (0: none), deleted with the test.
func newStream(t *testing.T, js jetstream.JetStream, maxMsgSize int32) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := uniqueName("L")
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{name + ".>"}, Duplicates: 2 * time.Minute, MaxMsgSize: maxMsgSize,
		Metadata: map[string]string{kn.MetadataPartitions: "2"},
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, name)
		_ = js.DeleteStream(ctx, kn.DeadLetterStream(name))
	})
	return name
}

// streamMsgs returns the stored messages of stream, oldest first.
func streamMsgs(t *testing.T, js jetstream.JetStream, stream string) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		out = append(out, m)
	}
	return out
}

// TestPayloadLimitFromStream: the payload limit is the stream's
// max_msg_size less HeaderRoom; a payload one byte over is a LimitError
// before anything is sent, one at the limit is stored even with a key and
// headers at their own limits, and a stream too small for the header room
// is refused when the topic opens.
func TestPayloadLimitFromStream(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js := connect(t)
	const room = 1000
	stream := newStream(t, js, kn.HeaderRoom+room)
	p, err := kn.OpenTopic(ctx, js, stream, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	if got := p.Limits().MaxPayloadBytes; got != room {
		t.Fatalf("MaxPayloadBytes = %d on a stream of max_msg_size %d, want %d", got, kn.HeaderRoom+room, room)
	}
	var le *keyorder.LimitError
	_, err = p.Publish(ctx, &keyorder.Message{Key: "k", Payload: make([]byte, room+1)})
	if !errors.As(err, &le) || le.Limit != "payload size" || le.Max != room || le.Got != room+1 || le.Backend != "nats" ||
		!errors.Is(err, keyorder.ErrInvalidMessage) {
		t.Fatalf("payload of %d bytes: %v, want a LimitError of payload size max %d", room+1, err, room)
	}
	// At the limit, with the longest key (carried in a header) and headers
	// whose JSON takes the most room the driver allows, the server stores it.
	long := strings.Repeat("\u00e9", kn.MaxKeyBytes/2)
	h := map[string]string{"x-big": strings.Repeat("\"", kn.MaxHeaderBytes/2-len("x-big"))}
	if _, err := p.Publish(ctx, &keyorder.Message{Key: long, Payload: make([]byte, room), Headers: h}); err != nil {
		t.Fatalf("payload at the limit with the longest key and headers: %v", err)
	}
	if got := len(streamMsgs(t, js, stream)); got != 1 {
		t.Fatalf("%d messages stored, want 1 (the over-limit one must not be sent)", got)
	}
	// TopicOptions.MaxPayloadBytes lowers the limit, never raises it.
	for _, c := range []struct{ opt, want int }{{10, 10}, {room * 10, room}} {
		p2, err := kn.OpenTopic(ctx, js, stream, &kn.TopicOptions{MaxPayloadBytes: c.opt}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := p2.Limits().MaxPayloadBytes; got != c.want {
			t.Errorf("MaxPayloadBytes option %d: limit %d, want %d", c.opt, got, c.want)
		}
		p2.Close(ctx)
	}
	small := newStream(t, js, kn.HeaderRoom)
	if _, err := kn.OpenTopic(ctx, js, small, nil, nil); !errors.Is(err, keyorder.ErrInvalidConfig) {
		t.Errorf("stream of max_msg_size %d (no room for a payload): %v, want ErrInvalidConfig", kn.HeaderRoom, err)
	}
}

// TestLongKeysEndToEnd: keys whose encoding does not fit a subject token
// travel as a digest token with the key in its header, and come back
// exactly, each its own ordering group, in order; shorter keys travel in
// the subject alone.
func TestLongKeysEndToEnd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	js := connect(t)
	stream := newStream(t, js, 0)
	keys := []string{
		strings.Repeat("k", 191),                   // the longest in the subject
		strings.Repeat("k", 192),                   // the shortest as a digest
		strings.Repeat("x", 300),                   // two long keys that share
		strings.Repeat("x", 299) + "y",             // all but their last byte
		strings.Repeat("\u00e9", kn.MaxKeyBytes/2), // the longest key
		"a.b *>",
	}
	p, err := kn.OpenTopic(ctx, js, stream, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	const per = 5
	for i := range per {
		for ki, k := range keys {
			if _, err := p.Publish(ctx, &keyorder.Message{Key: k, Payload: fmt.Appendf(nil, "%d/%d", ki, i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	p.Close(ctx)
	for _, m := range streamMsgs(t, js, stream)[:len(keys)] {
		tok := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
		key := m.Header.Get(kn.HeaderKey)
		switch {
		case strings.HasPrefix(tok, "h"):
			if len(tok) != 44 || len(key) <= 191 {
				t.Errorf("digest token %q (%d bytes) for a key of %d bytes", tok, len(tok), len(key))
			}
		case key != "":
			t.Errorf("subject token %.20q also carries its key in %s", tok, kn.HeaderKey)
		}
	}
	s, err := kn.OpenSubscription(ctx, js, stream, uniqueName("sub"), nil, &subscribe.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := map[string][]string{}
	n := 0
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- s.Run(runCtx, func(_ context.Context, d *keyorder.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			got[d.Key] = append(got[d.Key], string(d.Payload))
			n++
			return nil
		})
	}()
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		c := n
		mu.Unlock()
		if c >= per*len(keys) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("handled %d of %d", c, per*len(keys))
		}
	}
	stop()
	<-done
	s.Close(ctx)
	mu.Lock()
	defer mu.Unlock()
	if len(got) != len(keys) {
		t.Errorf("%d keys delivered, want %d", len(got), len(keys))
	}
	for ki, k := range keys {
		var want []string
		for i := range per {
			want = append(want, fmt.Sprintf("%d/%d", ki, i))
		}
		if g := got[k]; strings.Join(g, ",") != strings.Join(want, ",") {
			t.Errorf("key %d (%d bytes): delivered %v, want %v", ki, len(k), g, want)
		}
	}
}

// TestMsgIDOption: by default a message carries its ID as Nats-Msg-Id and
// a batch sent again is dropped by the stream's duplicate window; with
// NoMsgID (msg_id=off) the ID travels in Keyorder-Id, the stream
// tracks nothing, and a batch sent again is stored again.
func TestMsgIDOption(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js := connect(t)
	for _, c := range []struct {
		opts   *kn.TopicOptions
		stored int
	}{{nil, 2}, {&kn.TopicOptions{NoMsgID: true}, 4}} {
		stream := newStream(t, js, 0)
		d, err := kn.OpenTopicDriver(ctx, js, stream, c.opts)
		if err != nil {
			t.Fatal(err)
		}
		batch := []*driver.Message{{ID: "id-1", Key: "k", Payload: []byte("1")}, {ID: "id-2", Key: "k", Payload: []byte("2")}}
		for range 2 {
			if err := d.SendBatch(ctx, batch); err != nil {
				t.Fatal(err)
			}
		}
		d.Close()
		// The subscriber sees the IDs either way.
		s, err := kn.OpenSubscription(ctx, js, stream, uniqueName("sub"), nil, &subscribe.Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		ids := make(chan string, 8)
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- s.Run(runCtx, func(_ context.Context, d *keyorder.Delivery) error {
				ids <- d.ID
				return nil
			})
		}()
		seen := map[string]bool{}
		for len(seen) < 2 {
			select {
			case id := <-ids:
				if id != "id-1" && id != "id-2" {
					t.Errorf("NoMsgID %v: delivered ID %q, want id-1 or id-2", c.opts != nil, id)
				}
				seen[id] = true
			case <-ctx.Done():
				t.Fatalf("NoMsgID %v: delivered %v", c.opts != nil, seen)
			}
		}
		stop()
		<-done
		s.Close(ctx)
		ms := streamMsgs(t, js, stream)
		noID := c.opts != nil
		if len(ms) != c.stored {
			t.Errorf("NoMsgID %v: %d messages stored after sending a batch of 2 twice, want %d", noID, len(ms), c.stored)
		}
		for i, m := range ms {
			want := fmt.Sprintf("id-%d", i%2+1)
			msgID, own := m.Header.Get(nats.MsgIdHdr), m.Header.Get(kn.HeaderID)
			if !noID && (msgID != want || own != "") || noID && (msgID != "" || own != want) {
				t.Errorf("NoMsgID %v: message %d has Nats-Msg-Id %q, %s %q; want the ID %q in %s", noID, i, msgID, kn.HeaderID, own,
					want, map[bool]string{false: "Nats-Msg-Id", true: kn.HeaderID}[noID])
			}
		}
	}
}
