package drivertest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// fixture is one case's world: a topic, a publisher and what was handled.
type fixture struct {
	t    *testing.T
	ctx  context.Context
	caps Capabilities
	unit time.Duration
	pair *Pair
	rec  *recorder
}

func newFixture(t *testing.T, h Harness, caps Capabilities, spec Spec) *fixture {
	t.Helper()
	ctx := t.Context()
	if spec.LeaseDuration == 0 {
		spec.LeaseDuration = 30 * time.Second
	}
	pair, err := h.MakePair(ctx, t, spec)
	if err != nil {
		t.Fatalf("MakePair: %v", err)
	}
	return &fixture{t: t, ctx: ctx, caps: caps, unit: caps.Unit, pair: pair, rec: newRecorder()}
}

func (f *fixture) publisher(cfg *publish.Config) *publish.Publisher {
	f.t.Helper()
	if cfg == nil {
		cfg = &publish.Config{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(f.t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	p, err := publish.New(keepOpen{f.pair.Topic}, cfg)
	if err != nil {
		f.t.Fatalf("publish.New: %v", err)
	}
	f.t.Cleanup(func() { p.Close(context.Background()) })
	return p
}

// publish publishes messages named like "a1:A" (name:key; no key after the
// colon means keyless), in order, one at a time.
func (f *fixture) publish(p *publish.Publisher, specs ...string) {
	f.t.Helper()
	for _, s := range specs {
		name, key, _ := strings.Cut(s, ":")
		if _, err := p.Publish(f.ctx, &keyorder.Message{ID: f.t.Name() + "/" + name, Key: key, Payload: []byte(name)}); err != nil {
			f.t.Fatalf("publish %s: %v", s, err)
		}
	}
}

func (f *fixture) consumer() driver.Subscription {
	f.t.Helper()
	d, err := f.pair.OpenConsumer(f.ctx)
	if err != nil {
		f.t.Fatalf("OpenConsumer: %v", err)
	}
	return d
}

// running is a subscriber running in the background.
type running struct {
	sub     *subscribe.Subscriber
	done    chan error
	stopped bool
}

// subscribe starts a subscriber on a new consumer with handler h (which may
// be nil: record and ack).
func (f *fixture) subscribe(cfg *subscribe.Config, h subscribe.HandlerFunc) *running {
	f.t.Helper()
	return f.subscribeOn(f.consumer(), cfg, h)
}

func (f *fixture) subscribeOn(drv driver.Subscription, cfg *subscribe.Config, h subscribe.HandlerFunc) *running {
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
	sub, err := subscribe.New(drv, cfg)
	if err != nil {
		f.t.Fatalf("subscribe.New: %v", err)
	}
	if h == nil {
		h = func(ctx context.Context, d *keyorder.Delivery) error { return nil }
	}
	r := &running{sub: sub, done: make(chan error, 1)}
	wrapped := func(ctx context.Context, d *keyorder.Delivery) error {
		f.rec.start(d)
		err := h(ctx, d)
		f.rec.finish(d, err)
		return err
	}
	go func() { r.done <- sub.Run(context.WithoutCancel(f.ctx), wrapped) }()
	f.t.Cleanup(func() { r.stop(f.t) })
	return r
}

// stop shuts the subscriber down and waits for Run to return.
func (r *running) stop(t *testing.T) {
	if r.stopped {
		return
	}
	r.stopped = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.sub.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := <-r.done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// waitFor polls cond until it holds or the deadline (in units) passes.
func (f *fixture) waitFor(units int, what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(time.Duration(units) * f.unit)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out after %d units waiting for %s\nhandled so far:\n%s", units, what, f.rec.dump())
		}
		time.Sleep(f.unit / 50)
	}
}

// event is one handler start or finish.
type event struct {
	name    string
	key     string
	start   bool
	attempt int
	err     error
	at      time.Time
}

// recorder records handler activity and checks at most one in flight per
// key as it goes.
type recorder struct {
	mu       sync.Mutex
	events   []event
	inflight map[string]int // key -> handlers running
	maxPer   map[string]int
	running  map[string]bool // name -> running
}

func newRecorder() *recorder {
	return &recorder{inflight: map[string]int{}, maxPer: map[string]int{}, running: map[string]bool{}}
}

func nameOf(d *keyorder.Delivery) string { return string(d.Payload) }

func (r *recorder) start(d *keyorder.Delivery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, event{name: nameOf(d), key: d.Key, start: true, attempt: d.Attempt, at: time.Now()})
	r.running[nameOf(d)] = true
	if d.Key != "" {
		r.inflight[d.Key]++
		r.maxPer[d.Key] = max(r.maxPer[d.Key], r.inflight[d.Key])
	}
}

func (r *recorder) finish(d *keyorder.Delivery, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, event{name: nameOf(d), key: d.Key, attempt: d.Attempt, err: err, at: time.Now()})
	delete(r.running, nameOf(d))
	if d.Key != "" {
		r.inflight[d.Key]--
	}
}

// runningNow returns the names of handlers running, sorted.
func (r *recorder) runningNow() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for n := range r.running {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// starts returns the names of handler starts for key ("*" for all), in
// order, repeats included.
func (r *recorder) starts(key string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		if e.start && (key == "*" || e.key == key) {
			out = append(out, e.name)
		}
	}
	return out
}

// succeeded returns the names whose handler returned nil, in order.
func (r *recorder) succeeded(key string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		if !e.start && e.err == nil && (key == "*" || e.key == key) {
			out = append(out, e.name)
		}
	}
	return out
}

// firstEvent returns the first event matching.
func (r *recorder) firstEvent(match func(e event) bool) (event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if match(e) {
			return e, true
		}
	}
	return event{}, false
}

func (r *recorder) maxInFlight(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxPer[key]
}

func (r *recorder) dump() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for i, e := range r.events {
		if i >= 200 {
			fmt.Fprintf(&b, "... %d more\n", len(r.events)-i)
			break
		}
		kind := "end  "
		if e.start {
			kind = "start"
		}
		fmt.Fprintf(&b, "  %s %s key=%q attempt=%d err=%v\n", kind, e.name, e.key, e.attempt, e.err)
	}
	return b.String()
}

// gate lets a test decide each handler call's result: the handler blocks
// until the test sends the result for that message name.
type gate struct {
	mu sync.Mutex
	ch map[string]chan error
}

func newGate() *gate { return &gate{ch: map[string]chan error{}} }

func (g *gate) get(name string) chan error {
	g.mu.Lock()
	defer g.mu.Unlock()
	c, ok := g.ch[name]
	if !ok {
		c = make(chan error)
		g.ch[name] = c
	}
	return c
}

func (g *gate) handler(ctx context.Context, d *keyorder.Delivery) error {
	select {
	case err := <-g.get(nameOf(d)):
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// release sends name's handler its result.
func (g *gate) release(t *testing.T, name string, err error) {
	t.Helper()
	if e := g.tryRelease(name, err, time.Minute); e != nil {
		t.Fatal(e)
	}
}

// tryRelease sends name's handler its result, waiting up to timeout for the
// handler to run; it may be called from any goroutine.
func (g *gate) tryRelease(name string, err error, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case g.get(name) <- err:
		return nil
	case <-t.C:
		return fmt.Errorf("handler of %s is not running", name)
	}
}

// failingTopic wraps a driver to fail sends on demand (publish failure
// cases); it is fault injection at the driver boundary, not a fake broker.
type failingTopic struct {
	driver.Topic
	mu   sync.Mutex
	fail func(ms []*driver.Message) error
}

// SendBatch fails when the hook says so, else sends.
func (ft *failingTopic) SendBatch(ctx context.Context, ms []*driver.Message) error {
	ft.mu.Lock()
	fail := ft.fail
	ft.mu.Unlock()
	if fail != nil {
		if err := fail(ms); err != nil {
			return err
		}
	}
	return ft.Topic.SendBatch(ctx, ms)
}

// IsRetryable reports false: injected failures are final.
func (ft *failingTopic) IsRetryable(error) bool { return false }

// failKey makes sends of key's batches fail with err.
func (ft *failingTopic) failKey(key string, err error) {
	ft.setFail(func(ms []*driver.Message) error {
		if ms[0].Key == key {
			return err
		}
		return nil
	})
}

// setFail sets the failure hook (nil: no failures).
func (ft *failingTopic) setFail(fn func(ms []*driver.Message) error) {
	ft.mu.Lock()
	ft.fail = fn
	ft.mu.Unlock()
}

// keepOpen leaves closing the harness's topic driver to the harness.
type keepOpen struct{ driver.Topic }

// Close leaves the driver open.
func (keepOpen) Close() error { return nil }

// SendsMixedKeys forwards the driver's driver.MixedKeySender, so the
// conformance cases run the publisher's combined sends where the backend
// has them.
func (k keepOpen) SendsMixedKeys() bool {
	m, ok := k.Topic.(driver.MixedKeySender)
	return ok && m.SendsMixedKeys()
}

// counts returns the subscriber's counts (the process's own; an error from
// the backend's part is ignored: the conformance cases read only the
// process's counts).
func counts(s *subscribe.Subscriber) subscribe.Stats {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, _ := s.Stats(ctx)
	return st
}

// wantOneDeadLetter checks, after the group order was checked, that the
// subscription holds exactly one dead letter: payload, dead after one
// attempt with a reason containing reason. A backend that cannot list dead
// letters skips the rest of the case.
func (f *fixture) wantOneDeadLetter(sub *subscribe.Subscriber, payload, reason string) {
	f.t.Helper()
	dl, err := sub.DeadLetters(f.ctx, 10)
	if errors.Is(err, keyorder.ErrUnsupported) {
		f.t.Skipf("group order checked; listing dead letters is not supported by this backend (%v)", err)
	}
	if err != nil || len(dl) != 1 || string(dl[0].Message.Payload) != payload || dl[0].Attempts != 1 || !strings.Contains(dl[0].Reason, reason) {
		f.t.Fatalf("dead letters = %+v, %v; want %s with its reason and 1 attempt", dl, err, payload)
	}
}
