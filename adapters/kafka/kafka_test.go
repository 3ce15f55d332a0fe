package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/kafka"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/integration/drivertest"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// send publishes payloads of key through the topic driver, in order.
func send(ctx context.Context, t *testing.T, tp driver.Topic, key string, payloads ...string) {
	t.Helper()
	var ms []*driver.Message
	for _, p := range payloads {
		ms = append(ms, &driver.Message{ID: p, Key: key, Payload: []byte(p)})
	}
	if err := tp.SendBatch(ctx, ms); err != nil {
		t.Fatal(err)
	}
}

// receiveN receives until it has n messages (or fails the test).
func receiveN(ctx context.Context, t *testing.T, s driver.Subscription, n int) []*driver.Message {
	t.Helper()
	var out []*driver.Message
	for len(out) < n {
		ms, err := s.Receive(ctx, n-len(out))
		if err != nil {
			t.Fatalf("receive after %v: %v", payloads(out), err)
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

// nothingWithin reports what s receives within d (nothing, expected).
func nothingWithin(ctx context.Context, s driver.Subscription, d time.Duration) []*driver.Message {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	ms, _ := s.Receive(ctx, 100)
	return ms
}

// TestRestartRedeliversOnlyIncomplete: a member completes records out of
// order (2, 3 and 5 of 0..5) and closes; the next member of the group
// receives exactly the incomplete ones (0, 1, 4), because the completed
// ones above the committed offset travel in the commit metadata.
func TestRestartRedeliversOnlyIncomplete(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := newClient(t)
	topicName := createTopic(ctx, t, cl, 1)
	tp, err := kafka.OpenTopicDriver(ctx, cl, topicName, nil)
	if err != nil {
		t.Fatal(err)
	}
	send(ctx, t, tp, "A", "a0", "a1", "a2", "a3", "a4", "a5")
	group := uniqueName("g")
	opts := subOptions(t, drivertest.Spec{Ordering: policy.Ordered})
	s1, err := kafka.OpenSubscriptionDriver(ctx, topicName, group, opts)
	if err != nil {
		t.Fatal(err)
	}
	ms := receiveN(ctx, t, s1, 6)
	if got := payloads(ms); !slices.Equal(got, []string{"a0", "a1", "a2", "a3", "a4", "a5"}) {
		t.Fatalf("received %v", got)
	}
	if err := s1.Ack(ctx, []*driver.Message{ms[2], ms[3], ms[5]}); err != nil {
		t.Fatal(err)
	}
	if err := s1.Release(ctx, []*driver.Message{ms[0], ms[1], ms[4]}); err != nil {
		t.Fatal(err)
	}
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	// What the group committed: offset 0 and the done offsets above it.
	offs, err := kadm.NewClient(cl).FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	o, _ := offs.Lookup(topicName, 0)
	t.Logf("committed offset %d, metadata %q", o.At, o.Metadata)
	if o.At != 0 || !strings.HasPrefix(o.Metadata, "ko2.") {
		t.Errorf("committed %d %q, want offset 0 with the driver's metadata", o.At, o.Metadata)
	}
	s2, err := kafka.OpenSubscriptionDriver(ctx, topicName, group, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	ms = receiveN(ctx, t, s2, 3)
	if got := payloads(ms); !slices.Equal(got, []string{"a0", "a1", "a4"}) {
		t.Fatalf("after the restart received %v, want a0 a1 a4 (a2 a3 a5 completed)", got)
	}
	if extra := nothingWithin(ctx, s2, time.Second); len(extra) > 0 {
		t.Fatalf("then received %v, want nothing", payloads(extra))
	}
	if err := s2.Ack(ctx, ms); err != nil {
		t.Fatal(err)
	}
}

// TestReturnCarriesAttemptsAndDue: a member gives a record back with
// Return (it used 2 attempts; its retry is due in an hour), as the
// subscriber does at a graceful stop for a message waiting for its retry,
// and closes; the next member of the group receives it as attempt 3, held
// until the due time (NotBefore, to the millisecond), and a record given
// back with Release as it was (attempt 1, no delay).
func TestReturnCarriesAttemptsAndDue(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := newClient(t)
	topicName := createTopic(ctx, t, cl, 1)
	tp, err := kafka.OpenTopicDriver(ctx, cl, topicName, nil)
	if err != nil {
		t.Fatal(err)
	}
	send(ctx, t, tp, "A", "a0", "a1")
	send(ctx, t, tp, "B", "b0")
	group := uniqueName("g")
	opts := subOptions(t, drivertest.Spec{Ordering: policy.Ordered})
	s1, err := kafka.OpenSubscriptionDriver(ctx, topicName, group, opts)
	if err != nil {
		t.Fatal(err)
	}
	ms := receiveN(ctx, t, s1, 3)
	if got := payloads(ms); !slices.Equal(got, []string{"a0", "a1", "b0"}) {
		t.Fatalf("received %v", got)
	}
	due := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	if err := s1.Return(ctx, []driver.Returned{{Message: ms[0], Attempts: 2, NotBefore: due}}); err != nil {
		t.Fatal(err)
	}
	if err := s1.Release(ctx, ms[1:2]); err != nil {
		t.Fatal(err)
	}
	if err := s1.Ack(ctx, ms[2:]); err != nil {
		t.Fatal(err)
	}
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := kafka.OpenSubscriptionDriver(ctx, topicName, group, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	ms = receiveN(ctx, t, s2, 2)
	if got := payloads(ms); !slices.Equal(got, []string{"a0", "a1"}) {
		t.Fatalf("after the restart received %v, want a0 a1", got)
	}
	if ms[0].Attempt != 3 || !ms[0].NotBefore.Equal(due) {
		t.Errorf("a0 came back as attempt %d not before %v, want attempt 3 not before %v", ms[0].Attempt, ms[0].NotBefore, due)
	}
	if ms[1].Attempt != 1 || !ms[1].NotBefore.IsZero() {
		t.Errorf("a1 (released) came back as attempt %d not before %v, want attempt 1 at once", ms[1].Attempt, ms[1].NotBefore)
	}
	if err := s2.Ack(ctx, ms); err != nil {
		t.Fatal(err)
	}
}

// TestBackpressure: a partition with MaxPending records outstanding above
// its committed offset hands out no more until the offset moves; the
// first record completing lets the next ones through.
func TestBackpressure(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := newClient(t)
	topicName := createTopic(ctx, t, cl, 1)
	tp, err := kafka.OpenTopicDriver(ctx, cl, topicName, nil)
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for i := range 10 {
		all = append(all, fmt.Sprintf("m%d", i))
	}
	for i, p := range all {
		send(ctx, t, tp, fmt.Sprint("k", i), p)
	}
	opts := subOptions(t, drivertest.Spec{Ordering: policy.Ordered})
	opts.MaxPending = 4
	s, err := kafka.OpenSubscriptionDriver(ctx, topicName, uniqueName("g"), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ms := receiveN(ctx, t, s, 4)
	if extra := nothingWithin(ctx, s, time.Second); len(extra) > 0 {
		t.Fatalf("with 4 pending received %v more", payloads(extra))
	}
	// Completing m1..m3 does not move the committed offset (m0 is
	// pending): still nothing.
	if err := s.Ack(ctx, ms[1:]); err != nil {
		t.Fatal(err)
	}
	if extra := nothingWithin(ctx, s, time.Second); len(extra) > 0 {
		t.Fatalf("with m0 pending received %v", payloads(extra))
	}
	if err := s.Ack(ctx, ms[:1]); err != nil {
		t.Fatal(err)
	}
	more := receiveN(ctx, t, s, 4)
	if got := payloads(more); !slices.Equal(got, all[4:8]) {
		t.Fatalf("after m0 completed received %v, want %v", got, all[4:8])
	}
}

// TestLimits: what the limits accept is sent; a payload over them is
// refused before anything is sent, with a LimitError.
func TestLimits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := newClient(t)
	topicName := createTopic(ctx, t, cl, 1)
	pub, err := kafka.OpenTopic(ctx, cl, topicName, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(context.Background())
	l := pub.Limits()
	if _, err := pub.Publish(ctx, &keyorder.Message{Key: "k", Payload: make([]byte, l.MaxPayloadBytes)}); err != nil {
		t.Fatalf("payload of MaxPayloadBytes (%d): %v", l.MaxPayloadBytes, err)
	}
	_, err = pub.Publish(ctx, &keyorder.Message{Key: "k", Payload: make([]byte, l.MaxPayloadBytes+1)})
	var le *keyorder.LimitError
	if !errors.As(err, &le) {
		t.Fatalf("payload over the limit: %v, want a LimitError", err)
	}
	_, err = pub.Publish(ctx, &keyorder.Message{Key: "k", Payload: []byte("x"), Headers: map[string]string{"keyorder-id": "x"}})
	if !errors.As(err, &le) {
		t.Fatalf("reserved header: %v, want a LimitError", err)
	}
}

// TestURLRoundTrip: publish.Open and subscribe.Open of kafka:// URLs reach
// the broker; the key and headers survive; a permanent failure lands in
// <topic>.<group>.dead and is listed.
func TestURLRoundTrip(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := newClient(t)
	topicName := createTopic(ctx, t, cl, 2)
	base := "kafka://" + strings.Join(brokers(t), ",") + "/" + topicName
	pub, err := publish.Open(ctx, base, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(context.Background())
	for _, p := range []string{"ok", "bad"} {
		if _, err := pub.Publish(ctx, &keyorder.Message{Key: "K", Payload: []byte(p), Headers: map[string]string{"h": p}}); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := subscribe.Open(ctx, base+"?group="+uniqueName("g")+"&session_timeout=6s", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	got := make(chan string, 10)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- sub.Run(rctx, func(_ context.Context, d *keyorder.Delivery) error {
			got <- fmt.Sprintf("%s:%s:%s", d.Key, d.Payload, d.Headers["h"])
			if string(d.Payload) == "bad" {
				return keyorder.Permanent(errors.New("bad record"))
			}
			return nil
		})
	}()
	for _, want := range []string{"K:ok:ok", "K:bad:bad"} {
		select {
		case g := <-got:
			if g != want {
				t.Fatalf("handled %s, want %s", g, want)
			}
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", want, ctx.Err())
		}
	}
	var dls []keyorder.DeadLetter
	for ctx.Err() == nil {
		if dls, err = sub.DeadLetters(ctx, 0); err == nil && len(dls) == 1 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(dls) != 1 || string(dls[0].Message.Payload) != "bad" || !strings.Contains(dls[0].Reason, "bad record") {
		t.Fatalf("dead letters %+v, %v", dls, err)
	}
	stop()
	<-done
}

// TestRevocationWaitsForInFlight: member A holds the first record of each
// of two partitions in flight (the rest completed); member B joins and
// the group moves one partition to B. A's revocation waits for its record
// of that partition, so B receives nothing while A holds it; once A gives
// its records up, B receives exactly that partition's held record (the
// completed ones above it travel in the commit metadata).
func TestRevocationWaitsForInFlight(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := newClient(t)
	topicName := createTopic(ctx, t, cl, 2)
	tp, err := kafka.OpenTopicDriver(ctx, cl, topicName, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k := range 8 {
		key := fmt.Sprint("k", k)
		send(ctx, t, tp, key, key+"-1", key+"-2")
	}
	group := uniqueName("g")
	opts := subOptions(t, drivertest.Spec{Ordering: policy.Ordered})
	a, err := kafka.OpenSubscriptionDriver(ctx, topicName, group, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ms := receiveN(ctx, t, a, 16)
	held := map[int32]*driver.Message{} // the first record of each partition
	var done []*driver.Message
	for _, m := range ms {
		p := kafka.PartitionOf(m)
		if held[p] == nil {
			held[p] = m
			continue
		}
		done = append(done, m)
	}
	if len(held) != 2 {
		t.Fatalf("records in %d partitions, want 2", len(held))
	}
	if err := a.Ack(ctx, done); err != nil {
		t.Fatal(err)
	}
	b, err := kafka.OpenSubscriptionDriver(ctx, topicName, group, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got := make(chan []*driver.Message, 10)
	bctx, stopB := context.WithCancel(ctx)
	defer stopB()
	go func() {
		for bctx.Err() == nil {
			if ms, err := b.Receive(bctx, 10); err == nil {
				got <- ms
			}
		}
	}()
	// A's leases (30s) outlast the wait.
	select {
	case ms := <-got:
		t.Fatalf("B received %v while A held the first record of its partition", payloads(ms))
	case <-time.After(3 * time.Second):
	}
	if err := a.Release(ctx, []*driver.Message{held[0], held[1]}); err != nil {
		t.Fatal(err)
	}
	var bGot []*driver.Message
	select {
	case ms := <-got:
		bGot = ms
	case <-time.After(20 * time.Second):
		t.Fatal("B received nothing after A released its records")
	}
	if len(bGot) != 1 || (string(bGot[0].Payload) != string(held[0].Payload) && string(bGot[0].Payload) != string(held[1].Payload)) {
		t.Fatalf("B received %v, want one of the records A held (%s, %s)", payloads(bGot), held[0].Payload, held[1].Payload)
	}
	select {
	case ms := <-got:
		t.Fatalf("then B received %v, want nothing (completed records are in the commit metadata)", payloads(ms))
	case <-time.After(time.Second):
	}
}

// TestURLCreate: create=true makes the opener create a missing topic with
// the partitions asked for, on the subscription side and on the topic side,
// and leaves an existing one as it is.
func TestURLCreate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := newClient(t)
	adm := kadm.NewClient(cl)
	name := uniqueName("created")
	base := "kafka://" + strings.Join(brokers(t), ",") + "/" + name
	sub, err := subscribe.Open(ctx, base+"?group="+uniqueName("g")+"&create=true&partitions=3", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	tds, err := adm.ListTopics(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if td, ok := tds[name]; !ok || td.Err != nil || len(td.Partitions) != 3 {
		t.Fatalf("topic %s after create=true&partitions=3: %+v", name, tds[name])
	}
	// The topic side finds it existing: no error, partitions unchanged.
	pub, err := publish.Open(ctx, base+"?create=true&partitions=5", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(context.Background())
	if _, err := pub.Publish(ctx, &keyorder.Message{Key: "k", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	tds, err = adm.ListTopics(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(tds[name].Partitions); got != 3 {
		t.Errorf("an existing topic opened with partitions=5 has %d partitions, want 3 (unchanged)", got)
	}
}

// TestGracefulStopKeepsRetry: the subscriber and the driver together. A
// message fails with RetryAfter(3s) and the subscriber stops gracefully
// while it waits for the retry; the next member of the group runs it as
// attempt 2, not before the retry was due (the subscriber hands it back
// with driver.Returner; the driver keeps attempts and due time in the
// commit metadata), and then the key's next message.
func TestGracefulStopKeepsRetry(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl := newClient(t)
	topicName := createTopic(ctx, t, cl, 1)
	tp, err := kafka.OpenTopicDriver(ctx, cl, topicName, nil)
	if err != nil {
		t.Fatal(err)
	}
	send(ctx, t, tp, "A", "x", "y")
	group := uniqueName("g")
	opts := subOptions(t, drivertest.Spec{Ordering: policy.Ordered})
	const delay = 3 * time.Second
	failed := make(chan time.Time, 1)
	s1, err := kafka.OpenSubscription(ctx, topicName, group, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	run1 := make(chan error, 1)
	go func() {
		run1 <- s1.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
			if string(d.Payload) == "x" {
				failed <- time.Now()
				return keyorder.RetryAfter(errors.New("not yet"), delay)
			}
			t.Errorf("first member ran %s (attempt %d)", d.Payload, d.Attempt)
			return nil
		})
	}()
	var failedAt time.Time
	select {
	case failedAt = <-failed:
	case <-ctx.Done():
		t.Fatal("x never ran")
	}
	cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
	if err := s1.Close(cctx); err != nil {
		t.Fatal(err)
	}
	ccancel()
	<-run1
	type run struct {
		payload string
		attempt int
		at      time.Time
	}
	runs := make(chan run, 10)
	s2, err := kafka.OpenSubscription(ctx, topicName, group, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close(context.Background())
	go func() {
		_ = s2.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
			runs <- run{string(d.Payload), d.Attempt, time.Now()}
			return nil
		})
	}()
	var got []run
	for len(got) < 2 {
		select {
		case r := <-runs:
			got = append(got, r)
		case <-ctx.Done():
			t.Fatalf("second member ran %v", got)
		}
	}
	if got[0].payload != "x" || got[0].attempt != 2 || got[1].payload != "y" || got[1].attempt != 1 {
		t.Fatalf("second member ran %+v, want x as attempt 2, then y", got)
	}
	// The due time travels in milliseconds.
	if due := failedAt.Add(delay - time.Millisecond); got[0].at.Before(due) {
		t.Errorf("x ran again at %v, before its retry was due (%v)", got[0].at, due)
	}
}
