package sqs_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	awstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/sqs"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
)

func TestGroupID(t *testing.T) {
	long := strings.Repeat("k", 129)
	for _, tc := range []struct {
		key    string
		digest bool
	}{
		{"acct-42", false},
		{`a!"#$%&'()*+,-./:;<=>?@[\]^_{|}~z`, false},
		{strings.Repeat("k", 128), false},
		{long, true},
		{"with space", true},
		{"ключ", true},
		{"back`tick", true},
	} {
		g := sqs.GroupID(tc.key)
		if got := strings.HasPrefix(g, "h-") && g != tc.key; got != tc.digest {
			t.Errorf("GroupID(%q) = %q, digest %v, want %v", tc.key, g, got, tc.digest)
		}
		if g != sqs.GroupID(tc.key) || len(g) > 128 {
			t.Errorf("GroupID(%q) unstable or too long: %q", tc.key, g)
		}
	}
	if sqs.GroupID(long) == sqs.GroupID(long+"x") {
		t.Error("different keys share a digest group")
	}
}

func TestBadURLParams(t *testing.T) {
	ctx := context.Background()
	for _, u := range []string{
		"sqs://q.fifo?bogus=1",
		"sqs://q.fifo?ordering=sideways",
		"sqs://q.fifo?visibility=500ms",
		"sqs://q.fifo?wait=30s",
		"sqs://q.fifo?subscription=other.fifo",
		"sqs://q.fifo?endpoint=not-a-url",
		"sqs://standard-queue",
		"sqs://q.fifo/extra/path",
		"sqs://" + strings.Repeat("q", 71) + ".fifo",
	} {
		if _, err := driver.DefaultMux().OpenSubscription(ctx, u); !errors.Is(err, keyorder.ErrBadURL) {
			t.Errorf("OpenSubscription(%s) = %v, want ErrBadURL", u, err)
		}
		if _, err := driver.DefaultMux().OpenTopic(ctx, u); !errors.Is(err, keyorder.ErrBadURL) {
			t.Errorf("OpenTopic(%s) = %v, want ErrBadURL", u, err)
		}
	}
}

// open creates a fresh queue and returns its topic and one consumer.
func open(t *testing.T, ordering policy.Ordering, vis time.Duration) (*awssqs.Client, string, *sqs.Topic, *sqs.Subscription) {
	t.Helper()
	return openWith(t, &sqs.Options{Ordering: ordering, Lease: vis, WaitTime: time.Second})
}

func openWith(t *testing.T, opts *sqs.Options) (*awssqs.Client, string, *sqs.Topic, *sqs.Subscription) {
	t.Helper()
	client, _ := newClient(t)
	ctx := t.Context()
	q, err := sqs.CreateQueue(ctx, client, uniqueQueue("a"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteQueues(client, q) })
	topic, err := sqs.OpenTopicDriver(ctx, client, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := sqs.OpenSubscriptionDriver(ctx, client, q, opts)
	if err != nil {
		t.Fatal(err)
	}
	return client, q, topic, sub
}

func send(t *testing.T, topic *sqs.Topic, specs ...string) {
	t.Helper()
	var ms []*driver.Message
	for _, s := range specs {
		name, key, _ := strings.Cut(s, ":")
		ms = append(ms, &driver.Message{ID: t.Name() + "/" + name, Key: key, Payload: []byte(name)})
	}
	if err := topic.SendBatch(t.Context(), ms); err != nil {
		t.Fatal(err)
	}
}

// receive receives once (waiting up to the driver's poll) and returns
// "name@attempt" strings.
func receive(t *testing.T, sub *sqs.Subscription, n int, within time.Duration) ([]*driver.Message, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	ms, err := sub.Receive(ctx, n)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	var names []string
	for _, m := range ms {
		names = append(names, string(m.Payload)+"@"+itoa(m.Attempt))
	}
	return ms, names
}

func itoa(i int) string { return string(rune('0' + i)) }

func TestKeyRoundTrip(t *testing.T) {
	_, _, topic, sub := open(t, policy.Ordered, 30*time.Second)
	keys := []string{strings.Repeat("long", 100), "odd key\twith ÿ", "ctl\x01char", "plain"}
	var ms []*driver.Message
	for i, k := range keys {
		ms = append(ms, &driver.Message{ID: "id" + itoa(i), Key: k, Payload: []byte{0xff, 0x00, byte(i)}, Headers: map[string]string{"h": "v"}})
	}
	for _, m := range ms {
		if err := topic.SendBatch(t.Context(), []*driver.Message{m}); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]*driver.Message{}
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < len(keys) && time.Now().Before(deadline) {
		rs, _ := receive(t, sub, 10, 2*time.Second)
		for _, m := range rs {
			got[m.Key] = m
		}
		sub.Ack(t.Context(), rs)
	}
	for i, k := range keys {
		m := got[k]
		if m == nil {
			t.Fatalf("key %q not received (got %d keys)", k, len(got))
		}
		if m.ID != "id"+itoa(i) || !slices.Equal(m.Payload, []byte{0xff, 0x00, byte(i)}) || m.Headers["h"] != "v" {
			t.Errorf("key %q: got ID %q payload %v headers %v", k, m.ID, m.Payload, m.Headers)
		}
	}
}

func TestPayloadLimit(t *testing.T) {
	client, q, topic, _ := open(t, policy.Ordered, 30*time.Second)
	p, err := publish.New(topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	var le *keyorder.LimitError
	_, err = p.Publish(t.Context(), &keyorder.Message{Key: "k", Payload: make([]byte, sqs.MaxPayloadBytes+1)})
	if !errors.As(err, &le) || le.Max != sqs.MaxPayloadBytes {
		t.Fatalf("payload over MaxPayloadBytes: %v", err)
	}
	// Binary payloads go base64: within MaxPayloadBytes but too big encoded,
	// the driver refuses the batch before sending any of it.
	ok := &driver.Message{ID: "ok", Key: "k", Payload: []byte("fine")}
	big := &driver.Message{ID: "big", Key: "k", Payload: make([]byte, 200_000)}
	if err := topic.SendBatch(t.Context(), []*driver.Message{ok, big}); topic.ErrorCode(err) != keyorder.CodeInvalidArgument {
		t.Fatalf("binary payload over the encoded limit: %v (code %v)", err, topic.ErrorCode(err))
	}
	// Text payloads of exactly MaxPayloadBytes go through.
	if _, err := p.Publish(t.Context(), &keyorder.Message{ID: "max", Key: "k", Payload: []byte(strings.Repeat("x", sqs.MaxPayloadBytes))}); err != nil {
		t.Fatalf("text payload of MaxPayloadBytes: %v", err)
	}
	out, err := client.GetQueueAttributes(t.Context(), &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(q), AttributeNames: []awstypes.QueueAttributeName{"ApproximateNumberOfMessages"}})
	if err != nil || out.Attributes["ApproximateNumberOfMessages"] != "1" {
		t.Fatalf("queue holds %v messages (%v), want only the one sent", out.Attributes, err)
	}
}

func TestDeadLetterReasonAndAttempts(t *testing.T) {
	client, q, topic, sub := open(t, policy.Ordered, 30*time.Second)
	send(t, topic, "a1:A", "a2:A")
	ms, names := receive(t, sub, 1, 5*time.Second)
	if len(ms) != 1 || names[0] != "a1@1" {
		t.Fatalf("received %v", names)
	}
	if err := sub.DeadLetter(t.Context(), ms[0], "account closed", 3); err != nil {
		t.Fatal(err)
	}
	dq := strings.TrimSuffix(q, ".fifo") + "-dead.fifo"
	out, err := client.ReceiveMessage(t.Context(), &awssqs.ReceiveMessageInput{QueueUrl: aws.String(dq), MessageAttributeNames: []string{"All"}, WaitTimeSeconds: 1})
	if err != nil || len(out.Messages) != 1 {
		t.Fatalf("dead-letter queue: %v, %v", out, err)
	}
	a := out.Messages[0].MessageAttributes
	if aws.ToString(out.Messages[0].Body) != "a1" || aws.ToString(a[sqs.AttrReason].StringValue) != "account closed" ||
		aws.ToString(a[sqs.AttrAttempts].StringValue) != "3" || aws.ToString(a[sqs.AttrKey].StringValue) != "A" {
		t.Fatalf("dead letter %s with attributes %v", aws.ToString(out.Messages[0].Body), a)
	}
	// The group continues without it.
	if _, names := receive(t, sub, 1, 5*time.Second); !slices.Equal(names, []string{"a2@1"}) {
		t.Fatalf("after the dead letter received %v, want a2", names)
	}
}

func TestNackHoldsOnlyItsGroup(t *testing.T) {
	_, _, topic, sub := open(t, policy.Ordered, 30*time.Second)
	send(t, topic, "a1:A", "a2:A")
	send(t, topic, "b1:B", "b2:B")
	// One message per call: the two group heads.
	var ms []*driver.Message
	var names []string
	for range 2 {
		m, n := receive(t, sub, 1, 5*time.Second)
		ms, names = append(ms, m...), append(names, n...)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"a1@1", "b1@1"}) {
		t.Fatalf("received %v, want the two group heads", names)
	}
	byName := map[string]*driver.Message{}
	for _, m := range ms {
		byName[string(m.Payload)] = m
	}
	nacked := time.Now()
	if err := sub.Nack(t.Context(), byName["a1"], 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := sub.Ack(t.Context(), []*driver.Message{byName["b1"]}); err != nil {
		t.Fatal(err)
	}
	// Group B goes on; group A is held.
	rs, names := receive(t, sub, 10, 3*time.Second)
	if !slices.Equal(names, []string{"b2@1"}) {
		t.Fatalf("while A is held received %v, want b2", names)
	}
	sub.Ack(t.Context(), rs)
	var got []string
	for len(got) < 2 && time.Since(nacked) < 10*time.Second {
		rs, n := receive(t, sub, 10, 2*time.Second)
		if len(rs) > 0 && time.Since(nacked) < 2*time.Second {
			t.Fatalf("group A delivered %v %v after the Nack, before its delay", n, time.Since(nacked))
		}
		sub.Ack(t.Context(), rs)
		got = append(got, n...)
	}
	if !slices.Equal(got, []string{"a1@2", "a2@1"}) {
		t.Fatalf("after the delay received %v, want a1 (attempt 2) then a2", got)
	}
}

// Under Ordered a receive brings a group's consecutive messages as a chain,
// and a message put back unrun keeps its attempt: a head by this driver's
// book, a tail since it came behind its head.
func TestOrderedReleaseKeepsAttempts(t *testing.T) {
	_, _, topic, sub := open(t, policy.Ordered, 30*time.Second)
	send(t, topic, "a1:A", "a2:A", "a3:A")
	send(t, topic, "b1:B")
	for round := 0; round < 3; round++ {
		ms, names := receive(t, sub, 10, 5*time.Second)
		if i := slices.Index(names, "a1@1"); i < 0 || len(names) < i+3 || names[i+1] != "a2@1" || names[i+2] != "a3@1" {
			t.Fatalf("round %d received %v, want the chain a1 a2 a3, attempt 1", round, names)
		}
		slices.Sort(names)
		if !slices.Equal(names, []string{"a1@1", "a2@1", "a3@1", "b1@1"}) {
			t.Fatalf("round %d received %v, want everything, attempt 1", round, names)
		}
		if err := sub.Release(t.Context(), ms); err != nil {
			t.Fatal(err)
		}
	}
	ms, names := receive(t, sub, 1, 5*time.Second)
	if len(ms) != 1 {
		t.Fatalf("Receive(1) = %v", names)
	}
	sub.Ack(t.Context(), ms)
	var got []string
	for len(got) < 3 {
		rs, names := receive(t, sub, 10, 5*time.Second)
		if len(rs) == 0 {
			t.Fatalf("after %v, nothing more", got)
		}
		sub.Ack(t.Context(), rs)
		got = append(got, names...)
	}
	if want := []string{"a2@1", "a3@1"}; ms[0].Key == "B" {
		got = got[:2]
		if !slices.Equal(got, []string{"a1@1", "a2@1"}) {
			t.Fatalf("after b1 received %v", got)
		}
	} else if !slices.Contains(got, want[0]) || !slices.Contains(got, want[1]) || slices.Index(got, "a2@1") > slices.Index(got, "a3@1") {
		t.Fatalf("after a1 received %v, want a2 then a3 (and b1)", got)
	}
}

func TestURLOpenAndOrderingMismatch(t *testing.T) {
	_, endpoint := newClient(t)
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	name := uniqueQueue("u")
	base := "sqs://" + name + "?endpoint=" + url.QueryEscape(endpoint) + "&region=us-east-1"
	ctx := t.Context()
	topic, err := driver.DefaultMux().OpenTopic(ctx, base+"&ordering=exclusive")
	if err != nil {
		t.Fatal(err)
	}
	defer topic.Close()
	sub, err := driver.DefaultMux().OpenSubscription(ctx, base+"&ordering=exclusive&lease=5s&subscription="+name)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if c := sub.Capabilities(); c.Ordering != policy.Exclusive || c.LeaseDuration != 5*time.Second || !c.NativeHold {
		t.Fatalf("capabilities %+v", c)
	}
	_, err = driver.DefaultMux().OpenSubscription(ctx, base+"&ordering=ordered")
	if !errors.Is(err, sqs.ErrOrderingMismatch) || !errors.Is(err, keyorder.ErrFailedPrecondition) || keyorder.Code(err) != keyorder.CodeFailedPrecondition {
		t.Fatalf("ordering mismatch: %v", err)
	}
	client, _ := newClient(t)
	u, _ := client.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(name)})
	deleteQueues(client, aws.ToString(u.QueueUrl))
	if _, err := sub.Receive(ctx, 1); sub.ErrorCode(err) != keyorder.CodeNotFound {
		t.Fatalf("receive from a deleted queue: %v (code %v)", err, sub.ErrorCode(err))
	}
}

func TestExpiredLeaseReportedLost(t *testing.T) {
	_, _, topic, sub := open(t, policy.Ordered, time.Second)
	send(t, topic, "a1:A", "b1:B")
	ms, names := receive(t, sub, 10, 5*time.Second)
	if len(ms) != 2 {
		t.Fatalf("received %v", names)
	}
	a1, b1 := ms[0], ms[1]
	time.Sleep(700 * time.Millisecond)
	if lost, err := sub.ExtendLeases(t.Context(), []*driver.Message{b1}); err != nil || len(lost) != 0 {
		t.Fatalf("extending a live lease: lost %v, %v", lost, err)
	}
	time.Sleep(800 * time.Millisecond)
	// a1's lease expired and another consumer took it; b1's was extended.
	again, names := receive(t, sub, 10, 5*time.Second)
	if !slices.Equal(names, []string{"a1@2"}) {
		t.Fatalf("after a1's lease expired received %v, want a1 with attempt 2", names)
	}
	lost, err := sub.ExtendLeases(t.Context(), []*driver.Message{a1, b1, again[0]})
	if err != nil || len(lost) != 1 || lost[0] != a1 {
		t.Fatalf("ExtendLeases lost %v, %v; want the first a1 only", lost, err)
	}
}

func TestNotBeforeHoldIsNotAnAttempt(t *testing.T) {
	_, _, topic, sub := open(t, policy.Ordered, 30*time.Second)
	at := time.Now().Add(2500 * time.Millisecond)
	if err := topic.SendBatch(t.Context(), []*driver.Message{
		{ID: "a1", Key: "A", Payload: []byte("a1"), NotBefore: at},
		{ID: "a2", Key: "A", Payload: []byte("a2")},
	}); err != nil {
		t.Fatal(err)
	}
	if _, names := receive(t, sub, 10, 1500*time.Millisecond); len(names) != 0 {
		t.Fatalf("before a1's not-before time received %v", names)
	}
	var ms []*driver.Message
	var names []string
	for len(ms) == 0 && time.Until(at) > -5*time.Second {
		ms, names = receive(t, sub, 10, 2*time.Second)
	}
	if len(names) == 0 || names[0] != "a1@1" || time.Now().Add(time.Second).Before(at) {
		t.Fatalf("received %v at %v before the not-before time; want a1 with attempt 1 (the hold is not an attempt)", names, time.Until(at))
	}
	if !ms[0].NotBefore.Equal(at) {
		t.Errorf("NotBefore %v, published %v", ms[0].NotBefore, at)
	}
	sub.Ack(t.Context(), ms[:1])
	rest := names[1:]
	for len(rest) == 0 {
		_, rest = receive(t, sub, 10, 2*time.Second)
	}
	if !slices.Equal(rest, []string{"a2@1"}) {
		t.Fatalf("after a1 received %v, want a2 with attempt 1 (put back behind the hold, not counted)", rest)
	}
}

// Several dead letters in one group: DeadLetters lists every one of them
// (a FIFO dead-letter queue hands out nothing more of a group while one of
// its messages is in flight), oldest first, and Redrive puts them back in
// the order they died.
func TestDeadLettersOfOneGroup(t *testing.T) {
	_, _, topic, sub := open(t, policy.Ordered, 30*time.Second)
	var specs, want []string
	for i := 1; i <= 14; i++ {
		specs = append(specs, fmt.Sprintf("a%02d:A", i))
		if i <= 3 {
			specs = append(specs, fmt.Sprintf("b%02d:B", i))
		}
	}
	send(t, topic, specs...)
	for len(want) < len(specs) {
		ms, _ := receive(t, sub, 10, 5*time.Second)
		if len(ms) == 0 {
			t.Fatalf("only %d of %d received", len(want), len(specs))
		}
		for _, m := range ms {
			if err := sub.DeadLetter(t.Context(), m, "bad", 1); err != nil {
				t.Fatal(err)
			}
			want = append(want, m.ID)
		}
	}
	dls, err := sub.DeadLetters(t.Context(), 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, dl := range dls {
		got = append(got, dl.Message.ID)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("DeadLetters listed %d: %v\nwant %d, oldest first: %v", len(got), got, len(want), want)
	}
	// Listing twice lists the same.
	if again, err := sub.DeadLetters(t.Context(), 100); err != nil || len(again) != len(want) {
		t.Fatalf("second listing: %d, %v", len(again), err)
	}
	n, err := sub.Redrive(t.Context(), got)
	if err != nil || n != len(got) {
		t.Fatalf("Redrive = %d, %v", n, err)
	}
	if rest, err := sub.DeadLetters(t.Context(), 100); err != nil || len(rest) != 0 {
		t.Fatalf("after Redrive %d dead letters left, %v", len(rest), err)
	}
	var back []string
	for len(back) < len(want) {
		ms, _ := receive(t, sub, 10, 5*time.Second)
		if len(ms) == 0 {
			t.Fatalf("redriven: only %v came back", back)
		}
		for _, m := range ms {
			back = append(back, m.ID)
		}
		sub.Ack(t.Context(), ms)
	}
	for _, g := range []string{"/a", "/b"} {
		var w, b []string
		for _, id := range want {
			if strings.Contains(id, g) {
				w = append(w, id)
			}
		}
		for _, id := range back {
			if strings.Contains(id, g) {
				b = append(b, id)
			}
		}
		if !slices.Equal(w, b) {
			t.Errorf("group %s redriven in order %v, want %v", g, b, w)
		}
	}
}

// The URL opener takes its credentials from the SDK's default chain: the
// environment, or a shared credentials file with the URL's profile.
func TestURLCredentialsChain(t *testing.T) {
	client, endpoint := newClient(t)
	dir := t.TempDir()
	creds := filepath.Join(dir, "credentials")
	for k, v := range map[string]string{
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": filepath.Join(dir, "config"),
		"AWS_SHARED_CREDENTIALS_FILE": creds, "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
		"AWS_SESSION_TOKEN": "", "AWS_PROFILE": "", "AWS_ROLE_ARN": "", "AWS_WEB_IDENTITY_TOKEN_FILE": "",
		"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "", "AWS_CONTAINER_CREDENTIALS_FULL_URI": "",
	} {
		t.Setenv(k, v)
	}
	name := uniqueQueue("cred")
	base := "sqs://" + name + "?endpoint=" + url.QueryEscape(endpoint) + "&region=us-east-1"
	ctx := t.Context()
	t.Cleanup(func() {
		if u, err := client.GetQueueUrl(context.Background(), &awssqs.GetQueueUrlInput{QueueName: aws.String(name)}); err == nil {
			deleteQueues(client, aws.ToString(u.QueueUrl))
		}
	})
	if _, err := driver.DefaultMux().OpenTopic(ctx, base); err == nil {
		t.Fatal("opened with no credentials anywhere")
	}
	if _, err := driver.DefaultMux().OpenTopic(ctx, base+"&profile=missing"); !errors.Is(err, keyorder.ErrBadURL) {
		t.Fatalf("a profile that does not exist: %v, want ErrBadURL", err)
	}
	if err := os.WriteFile(creds, []byte("[keyorder-test]\naws_access_key_id = fromfile\naws_secret_access_key = secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	topic, err := driver.DefaultMux().OpenTopic(ctx, base+"&profile=keyorder-test")
	if err != nil {
		t.Fatalf("with the shared credentials file's profile: %v", err)
	}
	topic.Close()
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "none"))
	t.Setenv("AWS_ACCESS_KEY_ID", "fromenv")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	sub, err := driver.DefaultMux().OpenSubscription(ctx, base)
	if err != nil {
		t.Fatalf("with environment credentials: %v", err)
	}
	sub.Close()
}

// The URL opener's HTTP client keeps enough idle connections for a few
// hundred keys in flight (the SDK's default keeps 10 per host).
func TestHTTPClientKeepsIdleConnections(t *testing.T) {
	tr := sqs.NewHTTPClient().GetTransport()
	if tr.MaxIdleConnsPerHost != sqs.MaxIdleConnsPerHostDefault || tr.MaxIdleConns < sqs.MaxIdleConnsPerHostDefault {
		t.Fatalf("MaxIdleConnsPerHost %d, MaxIdleConns %d", tr.MaxIdleConnsPerHost, tr.MaxIdleConns)
	}
}
