package drivertest

// This file: the cases of throttling (subscribe.Config.Throttles) and
// composite keys (publish.Config.KeyFunc).

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/lanes"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// headerThrottle draws from the bucket named in the "throttle" header, so
// a case chooses which messages are throttled.
func headerThrottle(f *fixture, every time.Duration, burst int) []subscribe.Throttle {
	return []subscribe.Throttle{{
		By:    func(m *keyorder.Message) string { return m.Headers["throttle"] },
		Rate:  float64(time.Second) / float64(every),
		Burst: burst,
	}}
}

// publishThrottled publishes messages named like "a1:A" with header
// throttle=bucket ("" for none).
func (f *fixture) publishThrottled(p *publish.Publisher, bucket string, specs ...string) {
	f.t.Helper()
	for _, s := range specs {
		name, key := s, ""
		if i := slices.Index([]byte(s), ':'); i >= 0 {
			name, key = s[:i], s[i+1:]
		}
		m := &keyorder.Message{ID: f.t.Name() + "/" + name, Key: key, Payload: []byte(name)}
		if bucket != "" {
			m.Headers = map[string]string{"throttle": bucket}
		}
		if _, err := p.Publish(f.ctx, m); err != nil {
			f.t.Fatalf("publish %s: %v", s, err)
		}
	}
}

// checkNoAttemptCounted: every handler start was a first attempt (a wait
// on a throttle is not an attempt).
func (f *fixture) checkNoAttemptCounted() {
	f.t.Helper()
	f.rec.mu.Lock()
	defer f.rec.mu.Unlock()
	for _, e := range f.rec.events {
		if e.start && e.attempt != 1 {
			f.t.Fatalf("%s started with attempt %d: a throttle wait counted as an attempt", e.name, e.attempt)
		}
	}
}

// throttledKeyHoldsOnlyItself: under Ordered a message waiting on an empty
// bucket holds its group (nothing behind it runs first) and nothing else:
// other keys are handled meanwhile; no attempt is counted.
func throttledKeyHoldsOnlyItself(f *fixture) {
	every := 8 * f.unit
	p := f.publisher(nil)
	f.publishThrottled(p, "A", "a1:A", "a2:A", "a3:A")
	r := f.subscribe(&subscribe.Config{Workers: 2, MaxOutstanding: 2, Throttles: headerThrottle(f, every, 1)}, nil)
	f.waitFor(20, "a1 handled", func() bool { return len(f.rec.succeeded("A")) == 1 })
	f.publish(p, "b1:B", "b2:B", "b3:B", "b4:B")
	f.waitFor(40, "group B handled", func() bool { return len(f.rec.succeeded("B")) == 4 })
	if got := f.rec.starts("A"); len(got) > 1 {
		// Not a timing assertion on real servers: the bucket holds a2
		// for `every`; B's four messages were published after a1 ran.
		if f.caps.FakeClock {
			f.t.Fatalf("group A ran %v before group B finished, within a2's throttle wait", got)
		}
		f.t.Logf("slow machine: group A ran %v before B finished", got)
	}
	f.waitFor(60, "group A handled", func() bool { return len(f.rec.succeeded("A")) == 3 })
	if got, want := f.rec.starts("A"), []string{"a1", "a2", "a3"}; !slices.Equal(got, want) {
		f.t.Fatalf("group A handled %v, want %v", got, want)
	}
	f.checkNoAttemptCounted()
	f.checkSpacing("A", every)
	st, _ := r.sub.Stats(f.ctx)
	if st.Throttled == 0 {
		f.t.Fatalf("Stats.Throttled = 0, want the waits counted")
	}
}

// checkSpacing: starts of key are at least every apart (the bucket's
// rate; exactly every on the fake clock, where nothing else takes time).
func (f *fixture) checkSpacing(key string, every time.Duration) {
	f.t.Helper()
	var at []time.Time
	f.rec.mu.Lock()
	for _, e := range f.rec.events {
		if e.start && e.key == key {
			at = append(at, e.at)
		}
	}
	f.rec.mu.Unlock()
	for i := 1; i < len(at); i++ {
		d := at[i].Sub(at[i-1])
		if f.caps.FakeClock && d != every {
			f.t.Fatalf("start %d of %s came %v after the previous one, want exactly %v", i, key, d, every)
		}
		if d < every-every/20 {
			f.t.Fatalf("start %d of %s came %v after the previous one, faster than the bucket's %v", i, key, d, every)
		}
	}
}

// throttledMessageHoldsNothing: under Parallel and Exclusive a message
// waiting on an empty bucket holds nothing: other keys (and messages not
// drawing from its bucket) are handled meanwhile, and it runs once, as its
// first attempt, when its bucket has a token.
func throttledMessageHoldsNothing(f *fixture) {
	every := 8 * f.unit
	p := f.publisher(nil)
	f.publishThrottled(p, "slow", "s1:S", "s2:T")
	f.subscribe(&subscribe.Config{Workers: 2, MaxOutstanding: 2, Assign: lanes.Shared, Throttles: headerThrottle(f, every, 1)}, nil)
	f.waitFor(20, "one slow message handled", func() bool { return len(f.rec.succeeded("*")) == 1 })
	f.publish(p, "b1:B", "c1:C", "b2:B", "c2:C")
	f.waitFor(40, "the others handled", func() bool {
		return len(f.rec.succeeded("B")) == 2 && len(f.rec.succeeded("C")) == 2
	})
	if n := len(f.rec.starts("S")) + len(f.rec.starts("T")); n > 1 && f.caps.FakeClock {
		f.t.Fatalf("the throttled message ran before the others finished: %v", f.rec.starts("*"))
	}
	f.waitFor(60, "both slow messages handled", func() bool {
		return len(f.rec.succeeded("S")) == 1 && len(f.rec.succeeded("T")) == 1
	})
	if got := len(f.rec.starts("S")) + len(f.rec.starts("T")); got != 2 {
		f.t.Fatalf("the slow messages started %d times, want 2", got)
	}
	f.checkNoAttemptCounted()
	f.checkSpacingAcross([]string{"S", "T"}, every)
}

// checkSpacingAcross is checkSpacing over the starts of several keys that
// share one bucket.
func (f *fixture) checkSpacingAcross(keys []string, every time.Duration) {
	f.t.Helper()
	var at []time.Time
	f.rec.mu.Lock()
	for _, e := range f.rec.events {
		if e.start && slices.Contains(keys, e.key) {
			at = append(at, e.at)
		}
	}
	f.rec.mu.Unlock()
	for i := 1; i < len(at); i++ {
		if d := at[i].Sub(at[i-1]); d < every-every/20 || f.caps.FakeClock && d != every {
			f.t.Fatalf("starts on one bucket %v apart, want %v", d, every)
		}
	}
}

// throttleRateRespected: a bucket of burst 2 refilled once per 2 units,
// shared by 8 messages over 4 keys, lets at most burst+elapsed/every run at
// any time (exactly that many on the fake clock), and all of them in the
// end, each at its first attempt and each key in order.
func throttleRateRespected(f *fixture) {
	every, burst := 2*f.unit, 2
	p := f.publisher(nil)
	var specs []string
	for i := 1; i <= 2; i++ {
		for _, k := range []string{"A", "B", "C", "D"} {
			specs = append(specs, fmt.Sprintf("%s%d:%s", k, i, k))
		}
	}
	f.publishThrottled(p, "x", specs...)
	f.subscribe(&subscribe.Config{Workers: 4, Throttles: headerThrottle(f, every, burst)}, nil)
	f.waitFor(20, "the burst handled", func() bool { return len(f.rec.succeeded("*")) >= burst })
	first, _ := f.rec.firstEvent(func(e event) bool { return e.start })
	check := func() {
		f.t.Helper()
		n := len(f.rec.starts("*"))
		allowed := burst + int(time.Since(first.at)/every)
		if n > allowed {
			f.t.Fatalf("%d messages started %v after the first, the bucket allows %d", n, time.Since(first.at), allowed)
		}
		if f.caps.FakeClock && n != min(allowed, len(specs)) {
			f.t.Fatalf("%d messages started %v after the first, want exactly %d", n, time.Since(first.at), allowed)
		}
	}
	// Check half-way between refills, so no check races a refill.
	time.Sleep(every/2 - time.Since(first.at))
	for range 4 {
		check()
		time.Sleep(every)
	}
	f.waitFor(80, "all handled", func() bool { return len(f.rec.succeeded("*")) == len(specs) })
	for _, k := range []string{"A", "B", "C", "D"} {
		if got, want := f.rec.starts(k), []string{k + "1", k + "2"}; !slices.Equal(got, want) {
			f.t.Fatalf("key %s handled %v, want %v", k, got, want)
		}
	}
	f.checkNoAttemptCounted()
}

// compositeKey: a key defined at the mount site from the fairness key and a
// header reaches the broker as one ordering key (keyorder.JoinKey of the
// parts), is delivered as such, and orders its group; a message missing a
// part is rejected naming it, and nothing is sent.
func compositeKey(f *fixture) {
	p := f.publisher(&publish.Config{KeyFunc: keyorder.CompositeKey(keyorder.FairnessKeyPart(), keyorder.HeaderPart("account"))})
	send := func(name, tenant, account string) error {
		h := map[string]string{}
		if tenant != "" {
			h[keyorder.HeaderFairnessKey] = tenant
		}
		if account != "" {
			h["account"] = account
		}
		_, err := p.Publish(f.ctx, &keyorder.Message{ID: f.t.Name() + "/" + name, Payload: []byte(name), Headers: h})
		return err
	}
	for _, m := range [][3]string{{"x1", "t1", "a/1"}, {"y1", "t2", "a/1"}, {"x2", "t1", "a/1"}, {"y2", "t2", "a/1"}} {
		if err := send(m[0], m[1], m[2]); err != nil {
			f.t.Fatal(err)
		}
	}
	var mk *keyorder.MissingKeyError
	if err := send("bad", "t1", ""); !errors.As(err, &mk) || mk.Part != `header "account"` {
		f.t.Fatalf("a message without its account: %v, want a *keyorder.MissingKeyError naming the header", err)
	}
	f.subscribe(&subscribe.Config{Workers: 2, FairnessKey: subscribe.FairnessKeyHeader}, nil)
	kx, ky := keyorder.JoinKey("t1", "a/1"), keyorder.JoinKey("t2", "a/1")
	f.waitFor(40, "all handled", func() bool { return len(f.rec.succeeded("*")) == 4 })
	if got := f.rec.starts(kx); !slices.Equal(got, []string{"x1", "x2"}) {
		f.t.Fatalf("key %q handled %v, want x1 x2 (all: %v)", kx, got, f.rec.starts("*"))
	}
	if got := f.rec.starts(ky); !slices.Equal(got, []string{"y1", "y2"}) {
		f.t.Fatalf("key %q handled %v, want y1 y2", ky, got)
	}
	if slices.Contains(f.rec.starts("*"), "bad") {
		f.t.Fatal("the rejected message was delivered")
	}
}
