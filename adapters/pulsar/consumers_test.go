package pulsar_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters"
	"github.com/keyorder/keyorder/adapters/pulsar"
	"github.com/keyorder/keyorder/integration/testenv"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// TestKilledConsumerKeysMove: a consumer takes message 0 of a key and dies
// (its client closes without acknowledging). The key moves to the other
// consumer, which handles 0 before 1..4. The broker does not count a
// disconnect as a redelivery (Pulsar 4.0.7), so message 0 comes back with
// Attempt 1; a consumer that hangs instead is given up by its lease
// watchdog, which nacks first and so is counted (conformance case
// LostConsumerRedeliversFirst).
func TestKilledConsumerKeysMove(t *testing.T) {
	ctx := context.Background()
	topicName := uniqueTopic("killed")
	opts := &pulsar.SubscriptionOptions{Ordering: policy.Ordered}
	crashClient := newClient(t)
	crashed, err := pulsar.OpenSubscriptionDriver(ctx, crashClient, topicName, "s", opts)
	if err != nil {
		t.Fatal(err)
	}
	topic, err := pulsar.OpenTopicDriver(ctx, newClient(t), topicName, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer topic.Close()
	pub, err := publish.New(topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(ctx)
	for i := range 5 {
		if _, err := pub.Publish(ctx, &keyorder.Message{Key: "acct-42", Payload: []byte(strconv.Itoa(i))}); err != nil {
			t.Fatal(err)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ms, err := crashed.Receive(rctx, 1)
	if err != nil || len(ms) != 1 || string(ms[0].Payload) != "0" {
		t.Fatalf("crashing consumer received %v, %v", ms, err)
	}

	// The survivor attaches while the crashing consumer holds message 0.
	survivor, err := pulsar.OpenSubscriptionDriver(ctx, newClient(t), topicName, "s", opts)
	if err != nil {
		t.Fatal(err)
	}
	var got seen
	attempts := map[string]int{}
	var mu sync.Mutex
	runSubscriber(t, survivor, &subscribe.Config{Workers: 4}, func(ctx context.Context, d *keyorder.Delivery) error {
		got.add(string(d.Payload))
		mu.Lock()
		attempts[string(d.Payload)] = d.Attempt
		mu.Unlock()
		return nil
	})
	crashClient.Close() // dies without acknowledging: the connection closes
	waitFor(t, 30*time.Second, "the key's five messages on the survivor", func() bool { return len(got.get()) >= 5 })
	if want := []string{"0", "1", "2", "3", "4"}; !slices.Equal(got.get(), want) {
		t.Fatalf("survivor handled %v, want %v (message 0 back before its successors)", got.get(), want)
	}
	mu.Lock()
	defer mu.Unlock()
	if attempts["0"] != 1 {
		t.Errorf("message 0 came back with attempt %d; Pulsar 4.0.7 does not count a disconnect (RedeliveryCount 0): update the package documentation", attempts["0"])
	}
}

// inFlight tracks, across consumers, what each key is running.
type inFlight struct {
	mu         sync.Mutex
	t0         time.Time
	running    map[string]int
	done       map[string]int // highest sequence number finished per key
	handled    map[string][]int
	violations []string
	badKeys    map[string]bool
	trail      map[string][]string // per key: what ran where, for the failure message
}

func newInFlight() *inFlight {
	return &inFlight{t0: time.Now(), running: map[string]int{}, done: map[string]int{}, handled: map[string][]int{},
		badKeys: map[string]bool{}, trail: map[string][]string{}}
}

// note records an event of key for the failure message.
func (f *inFlight) note(key, format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.noteLocked(key, format, args...)
}

func (f *inFlight) noteLocked(key, format string, args ...any) {
	f.trail[key] = append(f.trail[key], fmt.Sprintf("%6.3fs ", time.Since(f.t0).Seconds())+fmt.Sprintf(format, args...))
}

// tracing wraps a subscription driver and notes in f's trail every message
// it receives, so that a failure tells the broker's delivery order apart
// from the order the process ran them in.
type tracing struct {
	adapters.Subscription
	f    *inFlight
	name string
}

func (d tracing) Receive(ctx context.Context, max int) ([]*adapters.Message, error) {
	ms, err := d.Subscription.Receive(ctx, max)
	for _, m := range ms {
		key, n, _ := strings.Cut(string(m.Payload), "/")
		d.f.note(key, "%s received %s (attempt %d)", d.name, n, m.Attempt)
	}
	return ms, err
}

// startOn is start for consumer c, recording attempt in the key's trail.
func (f *inFlight) startOn(c, key string, n, attempt int) {
	f.mu.Lock()
	f.noteLocked(key, "%s start %d attempt %d", c, n, attempt)
	f.mu.Unlock()
	f.start(key, n)
}

func (f *inFlight) start(key string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	before := len(f.violations)
	defer func() {
		if len(f.violations) > before && f.badKeys != nil {
			f.badKeys[key] = true
		}
	}()
	if f.running[key] > 0 {
		f.violations = append(f.violations, fmt.Sprintf("%s/%d started while %d of its key ran", key, n, f.running[key]))
	}
	if last, ok := f.done[key]; (ok && n > last+1) || (!ok && n > 0) {
		f.violations = append(f.violations, fmt.Sprintf("%s/%d started before %s/%d finished", key, n, key, n-1))
	}
	f.running[key]++
	f.handled[key] = append(f.handled[key], n)
}

func (f *inFlight) finish(key string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.running[key]--
	if last, ok := f.done[key]; !ok || n > last {
		f.done[key] = n
	}
}

func (f *inFlight) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, h := range f.handled {
		n += len(h)
	}
	return n
}

// check reports order violations (with the trail of each key concerned) and
// lost messages, and logs the redeliveries of finished messages.
func (f *inFlight) check(t *testing.T, keys, perKey int) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, v := range f.violations {
		t.Error(v)
	}
	for key := range f.badKeys {
		t.Logf("what %s ran, by consumer:\n%s", key, strings.Join(f.trail[key], "\n"))
	}
	dups := 0
	for k := range keys {
		key := "k" + strconv.Itoa(k)
		dups += len(f.handled[key]) - perKey
		for i := range perKey {
			if !slices.Contains(f.handled[key], i) {
				t.Errorf("%s/%d lost", key, i)
			}
		}
	}
	t.Logf("%d messages handled, %d redeliveries of finished messages", keys*perKey+dups, dups)
}

func (f *inFlight) complete(keys, perKey int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k := range keys {
		if last, ok := f.done["k"+strconv.Itoa(k)]; !ok || last < perKey-1 {
			return false
		}
	}
	return true
}

// TestConsumersJoinAndLeave: two consumer processes, a third joins
// mid-stream and one leaves: per-key order holds across them, nothing is
// lost, and a key never runs on two consumers at once (Pulsar 4's
// Key_Shared draining hashes keep a key with its consumer until that
// consumer acknowledged what it had).
func TestConsumersJoinAndLeave(t *testing.T) {
	ctx := context.Background()
	topicName := uniqueTopic("join")
	const keys, perKey = 20, 100
	f := newInFlight()
	handlerOn := func(c string) subscribe.HandlerFunc {
		return func(ctx context.Context, d *keyorder.Delivery) error {
			key, ns, _ := strings.Cut(string(d.Payload), "/")
			n, _ := strconv.Atoi(ns)
			f.startOn(c, key, n, d.Attempt)
			defer f.finish(key, n)
			// A little work, so keys moving between consumers overlap with
			// handlers that run.
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Millisecond):
			}
			return nil
		}
	}
	type proc struct {
		sub    *subscribe.Subscriber
		drv    adapters.Subscription
		cancel context.CancelFunc
		done   chan struct{}
	}
	procs := 0
	start := func() *proc {
		procs++
		name := "c" + strconv.Itoa(procs)
		drv, err := pulsar.OpenSubscriptionDriver(ctx, newClient(t), topicName, "s",
			&pulsar.SubscriptionOptions{Ordering: policy.Ordered, ReceiverQueueSize: 50})
		if err != nil {
			t.Fatal(err)
		}
		sub, err := subscribe.New(tracing{drv, f, name}, &subscribe.Config{Workers: 4})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		p := &proc{sub: sub, drv: drv, cancel: cancel, done: make(chan struct{})}
		go func() {
			defer close(p.done)
			sub.Run(rctx, handlerOn(name))
			for k := range keys {
				f.note("k"+strconv.Itoa(k), "%s stopped; closing its consumer", name)
			}
			drv.Close()
			for k := range keys {
				f.note("k"+strconv.Itoa(k), "%s consumer closed", name)
			}
		}()
		t.Cleanup(func() { cancel(); <-p.done })
		return p
	}
	p1, _ := start(), start()

	topic, err := pulsar.OpenTopicDriver(ctx, newClient(t), topicName, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer topic.Close()
	pub, err := publish.New(topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(ctx)
	// Everything is published at once, so every key has a backlog that
	// Key_Shared must keep on one consumer while consumers come and go.
	var wg sync.WaitGroup
	for k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "k" + strconv.Itoa(k)
			for i := range perKey {
				if _, err := pub.Publish(ctx, &keyorder.Message{Key: key, Payload: []byte(key + "/" + strconv.Itoa(i))}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	waitFor(t, 60*time.Second, "a third handled", func() bool { return f.count() >= keys*perKey/3 })
	start() // a third consumer joins
	for k := range keys {
		f.note("k"+strconv.Itoa(k), "c3 joined")
	}
	waitFor(t, 60*time.Second, "two thirds handled", func() bool { return f.count() >= 2*keys*perKey/3 })
	// The first leaves gracefully: running handlers finish, what it holds
	// returns to the broker when it disconnects.
	sctx, scancel := context.WithTimeout(ctx, 20*time.Second)
	if err := p1.sub.Close(sctx); err != nil {
		t.Errorf("close: %v", err)
	}
	scancel()
	<-p1.done
	waitFor(t, 60*time.Second, "every message handled", func() bool { return f.complete(keys, perKey) })
	f.check(t, keys, perKey)
}

// TestConsumersChurn: consumers leave gracefully and new ones join, again
// and again, while every key has a backlog; per-key order holds across all
// of them and nothing is lost. Each leave returns what the consumer held
// to the broker, which must hand it to the key's next owner before the
// key's later messages.
func TestConsumersChurn(t *testing.T) {
	ctx := context.Background()
	topicName := uniqueTopic("churn")
	const keys, perKey, churns = 20, 150, 8
	f := newInFlight()
	type proc struct {
		name string
		sub  *subscribe.Subscriber
		done chan struct{}
	}
	n := 0
	start := func() *proc {
		n++
		p := &proc{name: "c" + strconv.Itoa(n), done: make(chan struct{})}
		drv, err := pulsar.OpenSubscriptionDriver(ctx, newClient(t), topicName, "s",
			&pulsar.SubscriptionOptions{Ordering: policy.Ordered, ReceiverQueueSize: 50})
		if err != nil {
			t.Fatal(err)
		}
		p.sub, err = subscribe.New(tracing{drv, f, p.name}, &subscribe.Config{Workers: 4})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		go func() {
			defer close(p.done)
			p.sub.Run(rctx, func(ctx context.Context, d *keyorder.Delivery) error {
				key, ns, _ := strings.Cut(string(d.Payload), "/")
				i, _ := strconv.Atoi(ns)
				f.startOn(p.name, key, i, d.Attempt)
				defer f.finish(key, i)
				select {
				case <-ctx.Done():
				case <-time.After(2 * time.Millisecond):
				}
				return nil
			})
			drv.Close()
		}()
		t.Cleanup(func() { cancel(); <-p.done })
		return p
	}
	procs := []*proc{start(), start()}

	topic, err := pulsar.OpenTopicDriver(ctx, newClient(t), topicName, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer topic.Close()
	pub, err := publish.New(topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(ctx)
	for k := range keys {
		key := "k" + strconv.Itoa(k)
		ms := make([]*keyorder.Message, perKey)
		for i := range perKey {
			ms[i] = &keyorder.Message{Key: key, Payload: []byte(key + "/" + strconv.Itoa(i))}
		}
		if _, err := pub.PublishBatch(ctx, ms); err != nil {
			t.Fatal(err)
		}
	}
	for c := 1; c <= churns; c++ {
		waitFor(t, 60*time.Second, "the next share handled", func() bool { return f.count() >= c*keys*perKey/(churns+2) })
		old := procs[0]
		procs = append(procs[1:], start())
		for k := range keys {
			f.note("k"+strconv.Itoa(k), "%s leaving, %s joined", old.name, procs[len(procs)-1].name)
		}
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		if err := old.sub.Close(sctx); err != nil {
			t.Errorf("close %s: %v", old.name, err)
		}
		cancel()
		<-old.done
		for k := range keys {
			f.note("k"+strconv.Itoa(k), "%s left", old.name)
		}
	}
	waitFor(t, 60*time.Second, "every message handled", func() bool { return f.complete(keys, perKey) })
	f.check(t, keys, perKey)
}

// TestTopicUnloadMidStream: the broker unloads the topic (as load balancing
// and broker restarts do) while two consumers hold a backlog of every key.
// Every consumer is disconnected and reconnects; what they held is
// redelivered. Per-key order must hold and nothing may be lost.
func TestTopicUnloadMidStream(t *testing.T) {
	ctx := context.Background()
	admin := testenv.Require(t, testenv.PulsarAdmin)
	topicName := uniqueTopic("unload")
	const keys, perKey, unloads = 20, 150, 3
	f := newInFlight()
	for c := 1; c <= 2; c++ {
		name := "c" + strconv.Itoa(c)
		drv, err := pulsar.OpenSubscriptionDriver(ctx, newClient(t), topicName, "s",
			&pulsar.SubscriptionOptions{Ordering: policy.Ordered, ReceiverQueueSize: 50})
		if err != nil {
			t.Fatal(err)
		}
		runSubscriber(t, tracing{drv, f, name}, &subscribe.Config{Workers: 4}, func(ctx context.Context, d *keyorder.Delivery) error {
			key, ns, _ := strings.Cut(string(d.Payload), "/")
			i, _ := strconv.Atoi(ns)
			f.startOn(name, key, i, d.Attempt)
			defer f.finish(key, i)
			select {
			case <-ctx.Done():
			case <-time.After(2 * time.Millisecond):
			}
			return nil
		})
	}
	topic, err := pulsar.OpenTopicDriver(ctx, newClient(t), topicName, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer topic.Close()
	pub, err := publish.New(topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(ctx)
	for k := range keys {
		key := "k" + strconv.Itoa(k)
		ms := make([]*keyorder.Message, perKey)
		for i := range perKey {
			ms[i] = &keyorder.Message{Key: key, Payload: []byte(key + "/" + strconv.Itoa(i))}
		}
		if _, err := pub.PublishBatch(ctx, ms); err != nil {
			t.Fatal(err)
		}
	}
	path := strings.TrimPrefix(topicName, "persistent://")
	for u := 1; u <= unloads; u++ {
		waitFor(t, 60*time.Second, "the next share handled", func() bool { return f.count() >= u*keys*perKey/(unloads+1) })
		for k := range keys {
			f.note("k"+strconv.Itoa(k), "topic unloaded")
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, admin+"/admin/v2/persistent/"+path+"/unload", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("unload: %s", resp.Status)
		}
	}
	waitFor(t, 90*time.Second, "every message handled", func() bool { return f.complete(keys, perKey) })
	f.check(t, keys, perKey)
}
