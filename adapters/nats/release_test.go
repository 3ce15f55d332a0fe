package nats_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	kn "github.com/keyorder/keyorder/adapters/nats"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/driverkit"
)

// receiveN receives from d until it has n messages, failing the test after
// 20 s.
func receiveN(t *testing.T, d driver.Subscription, n int) []*driver.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []*driver.Message
	for len(out) < n {
		ms, err := d.Receive(ctx, n-len(out))
		if err != nil {
			t.Fatalf("received %v, then: %v", payloads(out), err)
		}
		out = append(out, ms...)
	}
	return out
}

func payloads(ms []*driver.Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, string(m.Payload))
	}
	return out
}

// publishKey sends the payloads as one key's messages, IDs "<payload>-id".
func publishKey(t *testing.T, js jetstream.JetStream, stream, key string, ps ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	td, err := kn.OpenTopicDriver(ctx, js, stream, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer td.Close()
	var ms []*driver.Message
	for _, p := range ps {
		ms = append(ms, &driver.Message{ID: p + "-id", Key: key, Payload: []byte(p)})
	}
	if err := td.SendBatch(ctx, ms); err != nil {
		t.Fatal(err)
	}
}

// recordWatch is a slog handler that keeps the debug lines a driver logs
// as text and, for each driverkit.LogRecordingFirst line, whether the run
// record of the message it names existed when it was logged.
type recordWatch struct {
	mu     sync.Mutex
	text   bytes.Buffer
	th     slog.Handler
	exists func(id string) bool
	before map[string]bool // id -> a record existed when the line was logged
}

func newRecordWatch(exists func(id string) bool) *recordWatch {
	w := &recordWatch{exists: exists, before: map[string]bool{}}
	w.th = slog.NewTextHandler(&w.text, &slog.HandlerOptions{Level: slog.LevelDebug})
	return w
}

func (w *recordWatch) Enabled(context.Context, slog.Level) bool { return true }
func (w *recordWatch) WithAttrs([]slog.Attr) slog.Handler       { return w }
func (w *recordWatch) WithGroup(string) slog.Handler            { return w }
func (w *recordWatch) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == driverkit.LogRecordingFirst {
		var id string
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "id" {
				id = a.Value.String()
			}
			return true
		})
		had := w.exists(id)
		w.mu.Lock()
		w.before[id] = had
		w.mu.Unlock()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.th.Handle(ctx, r)
}

// TestRedeliveryStartLoggedBeforeRecorded: a redelivered message's start is
// written to its run record before its handler runs, and the driver says so
// first with driverkit.LogRecordingFirst naming the message (as the SQS and
// Pub/Sub start stores do): a crash test reads that line to tell a start
// recorded in a process killed before the handler began from a run. The
// line comes before the write (the record does not exist yet when it is
// logged), the write before Started returns, and proctest's log reader
// finds the ID in the text line.
func TestRedeliveryStartLoggedBeforeRecorded(t *testing.T) {
	t.Parallel()
	js := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream := newStream(t, js, 0)
	sub := uniqueName("sub")
	publishKey(t, js, stream, "k", "m1")

	var kv jetstream.KeyValue
	var seqOf sync.Map // message ID -> stream sequence (driver.Message.Copy)
	w := newRecordWatch(func(id string) bool {
		seq, ok := seqOf.Load(id)
		if !ok || kv == nil {
			t.Errorf("logged a recorded start of %q, which was not received", id)
			return false
		}
		_, err := kv.Get(ctx, "r."+strconv.FormatUint(seq.(uint64), 10))
		return !errors.Is(err, jetstream.ErrKeyNotFound)
	})
	d, err := kn.OpenSubscriptionDriver(ctx, js, stream, sub, &kn.SubscriptionOptions{Lease: 2 * time.Second, Logger: slog.New(w)})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	m := receiveN(t, d, 1)[0]
	seqOf.Store(m.ID, m.Copy)
	if kv, err = js.KeyValue(ctx, kn.StateBucket(stream, sub)); err != nil {
		t.Fatal(err)
	}
	// Given back unstarted: it comes back as attempt 1, a redelivery.
	if err := d.Release(ctx, []*driver.Message{m}); err != nil {
		t.Fatal(err)
	}
	m = receiveN(t, d, 1)[0]
	if m.ID != "m1-id" || m.Attempt != 1 {
		t.Fatalf("after Release: %s attempt %d, want m1-id attempt 1", m.ID, m.Attempt)
	}
	if err := d.(driver.StartRecorder).Started(ctx, []*driver.Message{m}); err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	had, logged := w.before[m.ID]
	text := w.text.String()
	w.mu.Unlock()
	if !logged {
		t.Fatalf("no %q line for the redelivered m1; the log:\n%s", driverkit.LogRecordingFirst, text)
	}
	if had {
		t.Errorf("the run record of m1 existed when the line was logged: the line must come before the write")
	}
	e, err := kv.Get(ctx, "r."+strconv.FormatUint(m.Copy.(uint64), 10))
	if err != nil {
		t.Fatalf("m1's run record after Started: %v (the redelivery's start is written before Started returns)", err)
	}
	var rec struct{ Runs int }
	if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.Runs != 1 {
		t.Errorf("m1's run record %s (%v), want runs 1", e.Value(), err)
	}
	marker := "msg=" + strconv.Quote(driverkit.LogRecordingFirst)
	found := false
	for line := range strings.Lines(text) {
		found = found || strings.Contains(line, marker) && slices.Contains(strings.Fields(line), "id=m1-id")
	}
	if !found {
		t.Errorf("no line with %s and id=m1-id (what proctest reads); the log:\n%s", marker, text)
	}
}

// TestReleaseRedeliversInKeyOrder: Release naks, and the server hands a
// released message out again to this process at once, before the key's
// messages the process has not fetched (the server serves redeliveries
// first), so the driver declares driver.ReleaseRedeliverer. With
// MaxPending 1 the server lets the process hold one message of the
// partition: a1 released comes back before a2, as the same copy and
// attempt (unstarted), then, started and released again, as attempt 2.
// Messages released together out of order come back in stream order.
func TestReleaseRedeliversInKeyOrder(t *testing.T) {
	t.Parallel()
	js := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream := newStream(t, js, 0)
	publishKey(t, js, stream, "a", "a1", "a2", "a3")
	d, err := kn.OpenSubscriptionDriver(ctx, js, stream, uniqueName("sub"), &kn.SubscriptionOptions{Lease: 2 * time.Second, MaxPending: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if r, ok := d.(driver.ReleaseRedeliverer); !ok || !r.ReleaseRedelivers() {
		t.Fatalf("the NATS driver does not declare driver.ReleaseRedeliverer")
	}
	a1 := receiveN(t, d, 1)[0]
	if string(a1.Payload) != "a1" {
		t.Fatalf("first message %q, want a1", a1.Payload)
	}
	if err := d.Release(ctx, []*driver.Message{a1}); err != nil {
		t.Fatal(err)
	}
	again := receiveN(t, d, 1)[0]
	if string(again.Payload) != "a1" || again.Attempt != 1 || again.Copy != a1.Copy {
		t.Fatalf("after releasing a1 unstarted: %q attempt %d copy %v, want a1 attempt 1 copy %v", again.Payload, again.Attempt, again.Copy, a1.Copy)
	}
	if err := d.(driver.StartRecorder).Started(ctx, []*driver.Message{again}); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, []*driver.Message{again}); err != nil {
		t.Fatal(err)
	}
	third := receiveN(t, d, 1)[0]
	if string(third.Payload) != "a1" || third.Attempt != 2 {
		t.Fatalf("after releasing a1 started: %q attempt %d, want a1 attempt 2", third.Payload, third.Attempt)
	}
	if err := d.Ack(ctx, []*driver.Message{third}); err != nil {
		t.Fatal(err)
	}
	var rest []string
	for _, want := range []string{"a2", "a3"} {
		m := receiveN(t, d, 1)[0]
		rest = append(rest, string(m.Payload))
		if string(m.Payload) != want || m.Attempt != 1 {
			t.Fatalf("after a1: %v (attempt %d), want a2, a3 at attempt 1", rest, m.Attempt)
		}
		if err := d.Ack(ctx, []*driver.Message{m}); err != nil {
			t.Fatal(err)
		}
	}

	// Several at once, given back out of order.
	publishKey(t, js, stream, "b", "b1", "b2", "b3")
	d2, err := kn.OpenSubscriptionDriver(ctx, js, stream, uniqueName("sub"), &kn.SubscriptionOptions{Lease: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	var bs []*driver.Message
	for _, m := range receiveN(t, d2, 6) { // a1-a3 too: a new subscription starts at the stream's start
		if m.Key == "b" {
			bs = append(bs, m)
		}
	}
	slices.Reverse(bs)
	if err := d2.Release(ctx, bs); err != nil {
		t.Fatal(err)
	}
	if got := payloads(receiveN(t, d2, 3)); !slices.Equal(got, []string{"b1", "b2", "b3"}) {
		t.Errorf("b3, b2, b1 released together came back as %v, want b1, b2, b3", got)
	}
}
