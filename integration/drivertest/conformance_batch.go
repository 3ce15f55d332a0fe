package drivertest

// This file: the conformance cases of ordered batches (subscribe.RunBatch):
// a failure inside a batch, a batch that waits its MaxWait, RetryAfter and
// dead letters inside a batch, and shutdown in the middle of batches.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// batchLog records the batches a batch handler was given (their names, in
// order) and when each began.
type batchLog struct {
	mu      sync.Mutex
	batches [][]string
	at      []time.Time
}

func (l *batchLog) add(ds []*keyorder.Delivery) {
	names := make([]string, len(ds))
	for i, d := range ds {
		names[i] = nameOf(d)
	}
	l.mu.Lock()
	l.batches = append(l.batches, names)
	l.at = append(l.at, time.Now())
	l.mu.Unlock()
}

func (l *batchLog) get() ([][]string, []time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.batches), slices.Clone(l.at)
}

func (l *batchLog) String() string {
	b, _ := l.get()
	return fmt.Sprint(b)
}

// errNotRun marks, in the recorder, the messages of a batch after the one
// that failed: they were given to the handler but not handled.
var errNotRun = errors.New("not run: after the failed message of its batch")

// subscribeBatch starts a subscriber with RunBatch on a new consumer. Each
// message of a batch is recorded as started, and finished by the handler's
// result: nil before the failed index, the failed message's error at it,
// errNotRun after it.
func (f *fixture) subscribeBatch(cfg *subscribe.Config, log *batchLog, h subscribe.BatchHandlerFunc) *running {
	f.t.Helper()
	if cfg == nil {
		cfg = &subscribe.Config{}
	}
	if cfg.Retry.MinBackoff == 0 {
		cfg.Retry.MinBackoff = f.unit / 2
		cfg.Retry.MaxBackoff = 2 * f.unit
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(f.t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 20 * f.unit
	}
	sub, err := subscribe.New(f.consumer(), cfg)
	if err != nil {
		f.t.Fatalf("subscribe.New: %v", err)
	}
	if h == nil {
		h = func(ctx context.Context, ds []*keyorder.Delivery) error { return nil }
	}
	r := &running{sub: sub, done: make(chan error, 1)}
	wrapped := func(ctx context.Context, ds []*keyorder.Delivery) error {
		if log != nil {
			log.add(ds)
		}
		for _, d := range ds {
			f.rec.start(d)
		}
		err := h(ctx, ds)
		i, cause := len(ds), error(nil)
		if err != nil {
			i, cause = keyorder.BatchFailure(err)
			i = min(i, len(ds)-1)
		}
		for k, d := range ds {
			switch {
			case k < i:
				f.rec.finish(d, nil)
			case k == i:
				f.rec.finish(d, cause)
			default:
				f.rec.finish(d, errNotRun)
			}
		}
		return err
	}
	go func() { r.done <- sub.RunBatch(context.WithoutCancel(f.ctx), wrapped) }()
	f.t.Cleanup(func() { r.stop(f.t) })
	return r
}

// indexOf returns the index of the delivery named name in ds, or -1.
func indexOf(ds []*keyorder.Delivery, name string) int {
	return slices.IndexFunc(ds, func(d *keyorder.Delivery) bool { return nameOf(d) == name })
}

// firstDone returns key's names in the order of their first success.
func (f *fixture) firstDone(key string) []string {
	var out []string
	for _, s := range f.rec.succeeded(key) {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// checkBatches checks that every batch holds messages of one key, in their
// published order, none twice.
func (f *fixture) checkBatches(log *batchLog, order map[string][]string) {
	f.t.Helper()
	batches, _ := log.get()
	for _, b := range batches {
		for key, names := range order {
			if !slices.Contains(names, b[0]) {
				continue
			}
			at := slices.Index(names, b[0])
			if len(b) > len(names)-at || !slices.Equal(b, names[at:at+len(b)]) {
				f.t.Errorf("batch %v is not consecutive messages of key %s in order (%v)", b, key, names)
			}
		}
	}
}

// batchFailsAtIndex: a batch whose third message fails: the first two are
// acknowledged (never handled again), the third is retried before anything
// else of its key, and the fourth and fifth run after it, in order, their
// attempts not counted.
func batchFailsAtIndex(f *fixture) {
	p := f.publisher(nil)
	f.publish(p, "a1:A", "a2:A", "a3:A", "a4:A", "a5:A", "b1:B", "b2:B")
	var log batchLog
	var once sync.Once
	failedAt := -1
	r := f.subscribeBatch(&subscribe.Config{Workers: 2, Batch: &subscribe.BatchConfig{MaxSize: 5, MaxWait: 2 * f.unit}}, &log,
		func(ctx context.Context, ds []*keyorder.Delivery) error {
			var err error
			if i := indexOf(ds, "a3"); i >= 0 {
				once.Do(func() {
					failedAt = i
					err = keyorder.FailedAt(i, errors.New("a3 failed"))
				})
			}
			return err
		})
	f.waitFor(60, "a5 handled", func() bool { return slices.Contains(f.rec.succeeded("A"), "a5") })
	f.waitFor(20, "b2 handled", func() bool { return slices.Contains(f.rec.succeeded("B"), "b2") })
	f.t.Logf("batches: %v (a3 failed at index %d)", &log, failedAt)
	order := map[string][]string{"A": {"a1", "a2", "a3", "a4", "a5"}, "B": {"b1", "b2"}}
	f.checkBatches(&log, order)
	if got := f.firstDone("A"); !slices.Equal(got, order["A"]) {
		f.t.Fatalf("key A completed %v, want %v\n%s", got, order["A"], f.rec.dump())
	}
	// After a3's failure the next of key A to start is a3's retry.
	var afterFail []string
	failed := false
	for _, e := range f.recEvents() {
		if e.key != "A" {
			continue
		}
		if !e.start && e.name == "a3" && e.err != nil && !errors.Is(e.err, errNotRun) {
			failed = true
			continue
		}
		if failed && e.start {
			afterFail = append(afterFail, e.name)
		}
	}
	if len(afterFail) == 0 || afterFail[0] != "a3" {
		f.t.Fatalf("after a3 failed key A started %v; want a3's retry first\n%s", afterFail, f.rec.dump())
	}
	for _, n := range []string{"a1", "a2"} {
		if c := count(f.rec.starts("A"), n); c != 1 {
			f.t.Errorf("%s handled %d times; acknowledged before the failure, it must run once\n%s", n, c, f.rec.dump())
		}
	}
	// Attempts count only for the failed message.
	for _, e := range f.recEvents() {
		if !e.start && e.err == nil && e.key == "A" {
			want := 1
			if e.name == "a3" {
				want = 2
			}
			if e.attempt != want {
				f.t.Errorf("%s succeeded on attempt %d, want %d\n%s", e.name, e.attempt, want, f.rec.dump())
			}
		}
	}
	if f.caps.FakeClock && !r.sub.Capabilities().NativeHold {
		// Everything was published before the subscriber started: the
		// in-process batch takes key A's five at once.
		batches, _ := log.get()
		want := []string{"a1", "a2", "a3", "a4", "a5"}
		if !slices.ContainsFunc(batches, func(b []string) bool { return slices.Equal(b, want) }) {
			f.t.Errorf("batches %v: want key A's five messages in one batch", batches)
		}
	}
}

// batchMaxWait: fewer than MaxSize messages of a key arrive; the handler
// gets them (after about MaxWait where batches are assembled in process),
// not never.
func batchMaxWait(f *fixture) {
	p := f.publisher(nil)
	var log batchLog
	wait := 4 * f.unit
	r := f.subscribeBatch(&subscribe.Config{Workers: 2, Batch: &subscribe.BatchConfig{MaxSize: 10, MaxWait: wait}}, &log, nil)
	if f.caps.FakeClock {
		time.Sleep(f.unit) // the subscriber is receiving
	}
	start := time.Now()
	f.publish(p, "a1:A", "a2:A")
	f.waitFor(40, "a1 and a2 handled", func() bool { return len(f.rec.succeeded("A")) == 2 })
	if got := f.firstDone("A"); !slices.Equal(got, []string{"a1", "a2"}) {
		f.t.Fatalf("key A completed %v, want [a1 a2]", got)
	}
	batches, at := log.get()
	f.t.Logf("batches %v, the first %v after publishing", batches, at[0].Sub(start))
	if r.sub.Capabilities().NativeHold {
		return // a batch never waits: nothing more of its key comes while it is leased
	}
	if at[0].Sub(start) < wait-f.unit/5 {
		f.t.Errorf("batch %v handed over %v after publishing, before its MaxWait %v", batches[0], at[0].Sub(start), wait)
	}
	if f.caps.FakeClock {
		if !slices.Equal(batches[0], []string{"a1", "a2"}) || at[0].Sub(start) > wait+f.unit {
			f.t.Errorf("batches %v, the first at %v: want [a1 a2] at MaxWait %v", batches, at[0].Sub(start), wait)
		}
	}
}

// batchRetryAfter: a batch fails at a2 with RetryAfter: a2 and a3 wait the
// delay, key B does not, and a2 is retried first.
func batchRetryAfter(f *fixture) {
	p := f.publisher(nil)
	f.publish(p, "a1:A", "a2:A", "a3:A")
	var log batchLog
	var once sync.Once
	var failedAt time.Time
	var mu sync.Mutex
	delay := 6 * f.unit
	f.subscribeBatch(&subscribe.Config{Workers: 2, Batch: &subscribe.BatchConfig{MaxSize: 5, MaxWait: f.unit}}, &log,
		func(ctx context.Context, ds []*keyorder.Delivery) error {
			var err error
			if i := indexOf(ds, "a2"); i >= 0 {
				once.Do(func() {
					mu.Lock()
					failedAt = time.Now()
					mu.Unlock()
					err = keyorder.FailedAt(i, keyorder.RetryAfter(errors.New("later"), delay))
				})
			}
			return err
		})
	f.waitFor(30, "a2 failed", func() bool { mu.Lock(); defer mu.Unlock(); return !failedAt.IsZero() })
	f.publish(p, "b1:B")
	f.waitFor(30, "b1 handled", func() bool { return slices.Contains(f.rec.succeeded("B"), "b1") })
	mu.Lock()
	fa := failedAt
	mu.Unlock()
	if time.Since(fa) >= delay {
		f.t.Fatalf("key B waited for key A's RetryAfter")
	}
	f.waitFor(60, "a3 handled", func() bool { return slices.Contains(f.rec.succeeded("A"), "a3") })
	if got := f.firstDone("A"); !slices.Equal(got, []string{"a1", "a2", "a3"}) {
		f.t.Fatalf("key A completed %v, want [a1 a2 a3]\n%s", got, f.rec.dump())
	}
	retry, ok := f.rec.firstEvent(func(e event) bool { return e.start && e.name == "a2" && e.attempt == 2 })
	if !ok {
		f.t.Fatalf("a2 was not retried as attempt 2\n%s", f.rec.dump())
	}
	if retry.at.Sub(fa) < delay-f.unit/5 {
		f.t.Fatalf("a2 retried %v after failing, before its RetryAfter of %v", retry.at.Sub(fa), delay)
	}
	if e, ok := f.rec.firstEvent(func(e event) bool {
		return e.start && e.name == "a3" && e.at.After(fa) && e.at.Before(retry.at)
	}); ok {
		f.t.Fatalf("a3 started at %v, during a2's RetryAfter\n%s", e.at.Sub(fa), f.rec.dump())
	}
	f.checkBatches(&log, map[string][]string{"A": {"a1", "a2", "a3"}, "B": {"b1"}})
}

// batchDeadLetter: a batch fails at a2 with Permanent: a2 is dead-lettered
// with one attempt and the key continues with a3, a4.
func batchDeadLetter(f *fixture) {
	p := f.publisher(nil)
	f.publish(p, "a1:A", "a2:A", "a3:A", "a4:A")
	var log batchLog
	r := f.subscribeBatch(&subscribe.Config{Workers: 2, Batch: &subscribe.BatchConfig{MaxSize: 5, MaxWait: f.unit}}, &log,
		func(ctx context.Context, ds []*keyorder.Delivery) error {
			if i := indexOf(ds, "a2"); i >= 0 {
				return keyorder.FailedAt(i, keyorder.Permanent(errors.New("account closed")))
			}
			return nil
		})
	f.waitFor(40, "a4 handled", func() bool { return slices.Contains(f.rec.succeeded("A"), "a4") })
	if got := f.firstDone("A"); !slices.Equal(got, []string{"a1", "a3", "a4"}) {
		f.t.Fatalf("key A completed %v, want [a1 a3 a4]\n%s", got, f.rec.dump())
	}
	if c := count(f.rec.starts("A"), "a2"); c != 1 {
		f.t.Fatalf("a2 handled %d times, want once\n%s", c, f.rec.dump())
	}
	f.checkBatches(&log, map[string][]string{"A": {"a1", "a2", "a3", "a4"}})
	f.wantOneDeadLetter(r.sub, "a2", "account closed")
}

// batchShutdown: a subscriber is stopped while batches run; a batch
// interrupted at message k reports FailedAt(k, ctx.Err()). The next
// subscriber completes every message, each key in order.
func batchShutdown(f *fixture) {
	p := f.publisher(nil)
	const n = 120
	var msgs []*keyorder.Message
	order := map[string][]string{}
	for i := range n {
		key := fmt.Sprintf("k%d", i%6)
		name := fmt.Sprintf("m%03d", i)
		order[key] = append(order[key], name)
		msgs = append(msgs, &keyorder.Message{ID: f.t.Name() + "/" + name, Key: key, Payload: []byte(name)})
	}
	if _, err := p.PublishBatch(f.ctx, msgs); err != nil {
		f.t.Fatal(err)
	}
	var log batchLog
	slow := func(ctx context.Context, ds []*keyorder.Delivery) error {
		for k := range ds {
			select {
			case <-time.After(f.unit / 10):
			case <-ctx.Done():
				return keyorder.FailedAt(k, ctx.Err())
			}
		}
		return nil
	}
	cfg := func() *subscribe.Config {
		return &subscribe.Config{Workers: 4, Batch: &subscribe.BatchConfig{MaxSize: 5, MaxWait: f.unit / 2}}
	}
	first := f.subscribeBatch(cfg(), &log, slow)
	f.waitFor(200, "some handled", func() bool { return len(f.rec.succeeded("*")) >= n/4 })
	first.stop(f.t)
	if len(f.rec.runningNow()) != 0 {
		f.t.Fatalf("handlers still running after shutdown: %v", f.rec.runningNow())
	}
	if mid := len(f.rec.succeeded("*")); mid >= n {
		f.t.Fatalf("all %d handled before shutdown; the case needs a slower handler", n)
	}
	f.subscribeBatch(cfg(), &log, nil)
	f.waitFor(200, "all handled", func() bool {
		seen := map[string]bool{}
		for _, s := range f.rec.succeeded("*") {
			seen[s] = true
		}
		return len(seen) == n
	})
	for key, names := range order {
		if got := f.firstDone(key); !slices.Equal(got, names) {
			f.t.Errorf("key %s completed in order %v, published %v", key, got, names)
		}
	}
	f.checkBatches(&log, order)
}

// recEvents returns a copy of the recorded events.
func (f *fixture) recEvents() []event {
	f.rec.mu.Lock()
	defer f.rec.mu.Unlock()
	return slices.Clone(f.rec.events)
}

func count(ss []string, s string) int {
	n := 0
	for _, x := range ss {
		if x == s {
			n++
		}
	}
	return n
}

// batchProperty: random keys, random failures (retries with and without
// RetryAfter, dead letters) reported by index from batch handlers: every
// key completes in published order without its dead letters, each batch is
// one key's messages in order, and nothing is lost.
func batchProperty(f *fixture) {
	seed := rand.Uint64()
	if s := os.Getenv("KEYORDER_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	f.t.Logf("seed %d (rerun with KEYORDER_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	const nKeys, nMsgs = 20, 300
	p := f.publisher(nil)
	order := map[string][]string{}
	keyOf := map[string]string{}
	failPlan := map[string]int{} // name -> failures before success; 99 = permanent
	var msgs []*keyorder.Message
	for i := range nMsgs {
		key := fmt.Sprintf("k%02d", rng.IntN(nKeys))
		name := fmt.Sprintf("m%03d", i)
		order[key] = append(order[key], name)
		keyOf[name] = key
		switch r := rng.IntN(25); {
		case r == 0:
			failPlan[name] = 99
		case r < 4:
			failPlan[name] = 1 + rng.IntN(2)
		}
		msgs = append(msgs, &keyorder.Message{ID: f.t.Name() + "/" + name, Key: key, Payload: []byte(name)})
	}
	var mu sync.Mutex
	fails := map[string]int{}
	var log batchLog
	size := 2 + rng.IntN(9)
	r := f.subscribeBatch(&subscribe.Config{Workers: 2 + rng.IntN(4),
		Retry: policy.Retry{MaxAttempts: 4, MinBackoff: f.unit / 10, MaxBackoff: f.unit / 2},
		Batch: &subscribe.BatchConfig{MaxSize: size, MaxWait: f.unit / 5}}, &log,
		func(ctx context.Context, ds []*keyorder.Delivery) error {
			for k, d := range ds {
				name := nameOf(d)
				mu.Lock()
				plan, n := failPlan[name], fails[name]
				if n < plan {
					fails[name]++
				}
				mu.Unlock()
				switch {
				case plan == 99:
					return keyorder.FailedAt(k, keyorder.Permanent(errors.New("poison")))
				case n < plan && len(name)%2 == 0:
					return keyorder.FailedAt(k, keyorder.RetryAfter(errors.New("transient"), f.unit/5))
				case n < plan:
					return keyorder.FailedAt(k, errors.New("transient"))
				}
			}
			return nil
		})
	for i := 0; i < len(msgs); i += 50 {
		if _, err := p.PublishBatch(f.ctx, msgs[i:min(i+50, len(msgs))]); err != nil {
			f.t.Fatal(err)
		}
	}
	f.waitFor(400, "every message acked or dead-lettered", func() bool {
		return int(counts(r.sub).Acked+counts(r.sub).DeadLettered) >= nMsgs
	})
	r.stop(f.t)
	for key, names := range order {
		want := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return failPlan[n] == 99 })
		if got := f.firstDone(key); !slices.Equal(got, want) {
			f.t.Errorf("key %s completed %v, want %v (published order without dead letters)", key, got, want)
		}
	}
	dead := 0
	for _, v := range failPlan {
		if v == 99 {
			dead++
		}
	}
	if got := int(counts(r.sub).DeadLettered); got != dead {
		f.t.Errorf("dead-lettered %d messages, want the %d planned", got, dead)
	}
	batches, _ := log.get()
	for _, b := range batches {
		if len(b) > size {
			f.t.Errorf("batch %v is larger than MaxSize %d", b, size)
		}
		names := order[keyOf[b[0]]]
		for k := 1; k < len(b); k++ {
			if keyOf[b[k]] != keyOf[b[0]] || slices.Index(names, b[k]) <= slices.Index(names, b[k-1]) {
				f.t.Errorf("batch %v is not one key's messages in order", b)
				break
			}
		}
	}
	if f.t.Failed() {
		f.t.Logf("FAILED with seed %d", seed)
	}
}
