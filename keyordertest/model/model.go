package model

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// Errors the model's drivers return.
var (
	// ErrTransient is wrapped by every injected call failure; IsRetryable
	// reports true for it.
	ErrTransient = errors.New("model: injected transient failure")
	// ErrLeaseLost is returned by a settlement of a delivery whose lease
	// the broker no longer holds for the caller (reported or not).
	ErrLeaseLost = errors.New("model: lease lost")
	// ErrCrashed is returned by every call of a crashed instance.
	ErrCrashed = errors.New("model: instance crashed")
	// ErrInvalidConfig is returned by New for a configuration it cannot run.
	ErrInvalidConfig = errors.New("model: invalid configuration")
)

// Config is a model broker's configuration. The zero value is an Ordered
// subscription that holds keys in process (as Pub/Sub does), one message
// per receive, a 10 s lease, no optional interface and no fault.
type Config struct {
	// Seed seeds the broker's random source: the faults it draws.
	Seed uint64
	// Ordering is the subscription's policy.
	Ordering policy.Ordering
	// NativeHold: the broker holds a key while one of its messages is
	// leased (Capabilities.NativeHold). Otherwise it streams a key's
	// messages to the instance that holds the key, in key order.
	NativeHold bool
	// HoldChains declares Capabilities.HoldChains (with NativeHold).
	HoldChains bool
	// MaxBatch is the most messages one receive returns (and, with
	// NativeHold, the longest chain of a key): 1 when zero.
	MaxBatch int
	// LeaseDuration is a delivery's lease; 10 s when zero.
	LeaseDuration time.Duration
	// MixedKeys makes the topic driver a driver.MixedKeySender.
	MixedKeys bool
	// StartRecorder, Returner and Revocable make instance drivers
	// implement driver.StartRecorder, driver.Returner and
	// driver.Revocable.
	StartRecorder, Returner, Revocable bool
	// Faults sets how often each fault happens.
	Faults Faults
	// Settled, when set, is called for each message of each Ack ("ack")
	// and DeadLetter ("dead-letter") call, with the message's ID and
	// whether the call took effect for it (false: an injected failure, or
	// its lease was gone). It runs under the broker's lock and must not
	// call the broker. A test stamps its history with it: a message
	// dead-lettered unrun is resolved when the call lands, and one whose
	// call did not land comes back.
	Settled func(op, id string, took bool)
	// Trace, when set, is told each thing the broker does (a delivery, a
	// lost lease, a settlement), in words, under the broker's lock: it
	// must not call the broker. A failing test prints it.
	Trace func(event string)
}

// Faults are the probabilities of the faults a model broker draws. Each is
// in [0, 1]; zero never happens.
type Faults struct {
	// LoseLease is, per delivery renewed by ExtendLeases, the chance that
	// its lease is lost at that moment and reported lost.
	LoseLease float64
	// LoseOnSettle is, per Ack, Nack, Release or DeadLetter call, the
	// chance that the lease of its first message is lost just before the
	// call: the call answers ErrLeaseLost for it.
	LoseOnSettle float64
	// LoseWithLater: without NativeHold, a lost lease also takes back the
	// later deliveries of its key held by the same instance (redelivered
	// after it, as Pub/Sub does). A renewal reports them lost in the
	// same answer; a settlement, a Release or an expiry leaves them
	// unreported until they are renewed or settled. Without it a lease is
	// lost (or a message released) alone, per delivery: a key's earlier
	// message is redelivered while its later ones stay leased.
	LoseWithLater bool
	// Fail is, per call (Receive, Ack, Nack, Release, ExtendLeases,
	// DeadLetter), the chance that it fails retryably without effect;
	// FailAfterEffect that it takes effect and then fails retryably;
	// Timeout that it waits until its context ends (at most
	// TimeoutAfter) and then fails retryably, with or without effect.
	Fail, FailAfterEffect, Timeout float64
	// TimeoutAfter bounds a timed-out call's wait; 20 s when zero.
	TimeoutAfter time.Duration
	// StallRenewals is, per ExtendLeases call, the chance that it answers
	// without renewing anything: leases may run out unreported.
	StallRenewals float64
	// Duplicate is, per Receive, the chance that an acknowledged message
	// whose key is free is delivered again.
	Duplicate float64
}

// rec is one message on the subscription.
type rec struct {
	seq       int
	msg       driver.Message // as published, Payload owned by the broker
	attempts  int
	notBefore time.Time // retry or return time; the publish's NotBefore too with NativeHold
	acked     bool
	dead      bool
	lease     *lease // the live non-duplicate lease, nil when none
	lost      int    // leases lost
	// unseen: attempts counted for leases lost where no running consumer
	// knew of them (see Broker.UnseenCharges).
	unseen int
}

func (r *rec) settled() bool { return r.acked || r.dead }

// lease is one delivery.
type lease struct {
	id       uint64
	r        *rec
	inst     *Instance
	deadline time.Time
	msg      *driver.Message
	dup      bool // a redelivery of an acknowledged message
	nacked   bool
	// unseen: the Receive that took it failed after taking effect, so
	// no consumer ever saw this delivery.
	unseen bool
}

// Broker is a model subscription; see the package documentation.
type Broker struct {
	cfg Config

	mu       sync.Mutex
	rnd      *rand.Rand
	recs     []*rec
	leases   map[uint64]*lease
	next     uint64
	changed  chan struct{}
	dead     []driver.DeadLetter
	nInst    int
	ackedIDs map[string]bool
}

// New returns a model broker.
func New(cfg *Config) (*Broker, error) {
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = 1
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = 10 * time.Second
	}
	switch {
	case c.MaxBatch < 0:
		return nil, fmt.Errorf("%w: MaxBatch %d is negative", ErrInvalidConfig, c.MaxBatch)
	case c.LeaseDuration < 0:
		return nil, fmt.Errorf("%w: LeaseDuration %v is negative", ErrInvalidConfig, c.LeaseDuration)
	case c.HoldChains && !c.NativeHold:
		return nil, fmt.Errorf("%w: HoldChains needs NativeHold", ErrInvalidConfig)
	}
	if err := checkFaults(&c.Faults); err != nil {
		return nil, err
	}
	return &Broker{
		cfg: c, rnd: rand.New(rand.NewPCG(c.Seed, 0x6d6f64656c)),
		leases: map[uint64]*lease{}, changed: make(chan struct{}), ackedIDs: map[string]bool{},
	}, nil
}

// SetFaults replaces the broker's faults from now on (a test turns them
// off to let a scenario settle, say).
func (b *Broker) SetFaults(f Faults) error {
	if err := checkFaults(&f); err != nil {
		return err
	}
	b.mu.Lock()
	b.cfg.Faults = f
	b.mu.Unlock()
	return nil
}

// checkFaults validates f and fills its defaults.
func checkFaults(f *Faults) error {
	if f.TimeoutAfter == 0 {
		f.TimeoutAfter = 20 * time.Second
	}
	for _, p := range []struct {
		name string
		v    float64
	}{{"LoseLease", f.LoseLease}, {"LoseOnSettle", f.LoseOnSettle}, {"Fail", f.Fail}, {"FailAfterEffect", f.FailAfterEffect},
		{"Timeout", f.Timeout}, {"StallRenewals", f.StallRenewals}, {"Duplicate", f.Duplicate}} {
		if p.v < 0 || p.v > 1 {
			return fmt.Errorf("%w: Faults.%s %v is not in [0, 1]", ErrInvalidConfig, p.name, p.v)
		}
	}
	if f.Fail+f.FailAfterEffect+f.Timeout > 1 {
		return fmt.Errorf("%w: Faults.Fail+FailAfterEffect+Timeout exceeds 1", ErrInvalidConfig)
	}
	if f.TimeoutAfter < 0 {
		return fmt.Errorf("%w: Faults.TimeoutAfter %v is negative", ErrInvalidConfig, f.TimeoutAfter)
	}
	return nil
}

// Capabilities returns what the broker's instance drivers declare.
func (b *Broker) Capabilities() driver.Capabilities {
	return driver.Capabilities{
		Ordering: b.cfg.Ordering, NativeHold: b.cfg.NativeHold, HoldChains: b.cfg.HoldChains,
		LeaseDuration: b.cfg.LeaseDuration, MaxBatch: b.cfg.MaxBatch,
	}
}

// trace reports an event to Config.Trace; b.mu is held.
func (b *Broker) trace(format string, args ...any) {
	if b.cfg.Trace != nil {
		b.cfg.Trace(fmt.Sprintf(format, args...))
	}
}

// signal wakes waiting receivers; b.mu is held.
func (b *Broker) signal() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// chance draws true with probability p; b.mu is held.
func (b *Broker) chance(p float64) bool { return p > 0 && b.rnd.Float64() < p }

// publish stores ms in order.
func (b *Broker) publish(ms []*driver.Message) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range ms {
		r := &rec{seq: len(b.recs), msg: *m}
		r.msg.Payload = slices.Clone(m.Payload)
		r.msg.Headers = cloneHeaders(m.Headers)
		if b.cfg.NativeHold {
			r.notBefore = m.NotBefore
		}
		b.recs = append(b.recs, r)
	}
	b.signal()
}

func cloneHeaders(h map[string]string) map[string]string {
	if h == nil {
		return nil
	}
	out := make(map[string]string, len(h))
	for k, v := range h {
		out[k] = v
	}
	return out
}

// expire loses the leases whose deadline has passed; b.mu is held.
func (b *Broker) expire(now time.Time) {
	var gone []*lease
	for _, l := range b.leases {
		if !l.deadline.After(now) {
			gone = append(gone, l)
		}
	}
	slices.SortFunc(gone, func(x, y *lease) int { return int(x.id - y.id) })
	// Decided for all before any is taken back: taking one back changes
	// which is a key's first.
	counted := make([]bool, len(gone))
	for k, l := range gone {
		counted[k] = b.lostCounts(l)
	}
	for k, l := range gone {
		if b.leases[l.id] == l {
			b.loseCounted(l, counted[k])
		}
	}
}

// lose takes l back: its message is deliverable again, counting the
// attempt when it may have been running; b.mu is held.
func (b *Broker) lose(l *lease) { b.loseCounted(l, b.lostCounts(l)) }

// loseCounted is lose with the count decided; b.mu is held.
func (b *Broker) loseCounted(l *lease, counted bool) {
	b.trace("lease of %s (instance %d) lost, counted %v", l.r.msg.ID, l.inst.id, counted && !l.dup)
	b.drop(l)
	r := l.r
	r.lost++ // a duplicate's lease too (LostLeases)
	if l.dup {
		return
	}
	if counted {
		r.attempts++
		if l.unseen || l.inst.down {
			r.unseen++
		}
	}
	if !b.cfg.NativeHold && b.cfg.Faults.LoseWithLater && r.msg.Key != "" {
		for _, o := range b.recs[r.seq+1:] {
			if o.msg.Key == r.msg.Key && o.lease != nil && o.lease.inst == l.inst {
				b.trace("lease of %s (instance %d) lost with %s", o.msg.ID, l.inst.id, r.msg.ID)
				b.drop(o.lease)
				o.lost++ // uncounted: it may not have been running
			}
		}
	}
	b.signal()
}

// lostCounts reports whether losing l counts an attempt: whether its
// message may have been running. With StartRecorder the starts count
// instead. Under Ordered only a key's first unsettled delivery held by the
// instance may have been running; otherwise any.
func (b *Broker) lostCounts(l *lease) bool {
	if b.cfg.StartRecorder || l.nacked {
		return false
	}
	if b.cfg.Ordering != policy.Ordered || l.r.msg.Key == "" {
		return true
	}
	for _, o := range b.leases {
		if o != l && o.inst == l.inst && !o.dup && o.r.msg.Key == l.r.msg.Key && o.r.seq < l.r.seq {
			return false
		}
	}
	return true
}

// drop forgets l; b.mu is held.
func (b *Broker) drop(l *lease) {
	delete(b.leases, l.id)
	if l.r.lease == l {
		l.r.lease = nil
	}
}

// keyLeased reports whether any live lease holds key, and by which
// instance; b.mu is held.
func (b *Broker) keyLeased(key string) (*Instance, bool) {
	for _, l := range b.leases {
		if l.r.msg.Key == key {
			return l.inst, true
		}
	}
	return nil, false
}

// heldByOther reports whether an instance other than inst holds a live
// lease of key; b.mu is held.
func (b *Broker) heldByOther(key string, inst *Instance) bool {
	for _, l := range b.leases {
		if l.r.msg.Key == key && l.inst != inst {
			return true
		}
	}
	return false
}

// take leases up to max deliverable messages to inst for a Receive begun
// when inst.revokes was began; b.mu is held.
func (b *Broker) take(inst *Instance, max int, now time.Time, began uint64) []*driver.Message {
	var out []*driver.Message
	due := func(r *rec) bool { return !r.notBefore.After(now) }
	done := map[string]bool{} // keys decided in this take
	for _, r := range b.recs {
		if len(out) >= max {
			break
		}
		if r.settled() || r.lease != nil {
			continue
		}
		key := r.msg.Key
		if inst.withheld(key, began) {
			continue
		}
		if key == "" || b.cfg.Ordering == policy.Parallel && b.cfg.NativeHold {
			if due(r) {
				out = append(out, b.lend(inst, r, false, now))
			}
			continue
		}
		if done[key] {
			continue
		}
		if !b.cfg.NativeHold {
			// Streaming: the key goes to the instance that holds it, in
			// key order; a message waiting for its return time holds the
			// rest.
			if b.heldByOther(key, inst) {
				done[key] = true
				continue
			}
			if !due(r) || b.earlierPending(r) {
				done[key] = true
				continue
			}
			out = append(out, b.lend(inst, r, false, now))
			continue
		}
		// NativeHold: nothing of a leased key, but the next members of
		// a chain this result started (consecutive in it, MaxBatch at
		// most); the first unsettled message (Ordered) or the first due
		// one (Exclusive).
		n := 0
		for i := len(out) - 1; i >= 0 && out[i].Key == key; i-- {
			n++
		}
		chained := n > 0 && n < b.cfg.MaxBatch
		if _, leased := b.keyLeased(key); leased && !chained {
			done[key] = true
			continue
		}
		if !due(r) {
			if chained || b.cfg.Ordering == policy.Ordered {
				done[key] = true
			}
			continue
		}
		out = append(out, b.lend(inst, r, false, now))
	}
	if b.chance(b.cfg.Faults.Duplicate) && len(out) < max {
		var cands []*rec
		for _, r := range b.recs {
			if r.acked && r.lease == nil && !inst.withheld(r.msg.Key, began) {
				if _, ok := b.keyLeased(r.msg.Key); !ok || r.msg.Key == "" {
					cands = append(cands, r)
				}
			}
		}
		if len(cands) > 0 && (len(out) == 0 || !b.cfg.NativeHold) {
			r := cands[b.rnd.IntN(len(cands))]
			if !slices.ContainsFunc(out, func(m *driver.Message) bool { return m.Key == r.msg.Key && r.msg.Key != "" }) {
				out = append(out, b.lend(inst, r, true, now))
			}
		}
	}
	return out
}

// earlierPending reports whether a message of r's key published before it
// is unsettled and not leased (streaming: it must be delivered first);
// b.mu is held.
func (b *Broker) earlierPending(r *rec) bool {
	for _, o := range b.recs[:r.seq] {
		if o.msg.Key == r.msg.Key && !o.settled() && o.lease == nil {
			return true
		}
	}
	return false
}

// lend leases r to inst; b.mu is held.
func (b *Broker) lend(inst *Instance, r *rec, dup bool, now time.Time) *driver.Message {
	b.next++
	l := &lease{id: b.next, r: r, inst: inst, deadline: now.Add(b.cfg.LeaseDuration), dup: dup}
	m := r.msg
	m.Payload = slices.Clone(r.msg.Payload) // each delivery its own bytes
	m.Headers = cloneHeaders(r.msg.Headers)
	if m.Headers == nil {
		m.Headers = map[string]string{}
	}
	m.Headers[DeliveryHeader] = strconv.FormatUint(l.id, 10)
	m.AckID = l
	m.Attempt = r.attempts + 1
	m.Copy = r
	l.msg = &m
	b.leases[l.id] = l
	b.trace("%s delivered to instance %d, attempt %d, duplicate %v", r.msg.ID, inst.id, m.Attempt, dup)
	if !dup {
		r.lease = l
	}
	return &m
}

// nextWake is the next time something may become deliverable; b.mu is
// held.
func (b *Broker) nextWake(now time.Time) (time.Time, bool) {
	var wake time.Time
	ok := false
	at := func(t time.Time) {
		if t.After(now) && (!ok || t.Before(wake)) {
			wake, ok = t, true
		}
	}
	for _, l := range b.leases {
		at(l.deadline)
	}
	for _, r := range b.recs {
		if !r.settled() {
			at(r.notBefore)
		}
	}
	return wake, ok
}

// Acked reports whether the message with this ID was acknowledged (an Ack
// that took effect).
func (b *Broker) Acked(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ackedIDs[id]
}

// DeadLetters returns the dead letters, in the order they were made.
func (b *Broker) DeadLetters() []driver.DeadLetter {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.dead)
}

// LostLeases returns, per message ID, how many of its leases the broker
// took back (reported, expired, revoked or lost with a crashed instance),
// those of an acknowledged message delivered again (Faults.Duplicate)
// included: its key is free for another instance from then on, while the
// handler that ran the duplicate may still be running.
func (b *Broker) LostLeases() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]int{}
	for _, r := range b.recs {
		if r.lost > 0 {
			out[r.msg.ID] += r.lost
		}
	}
	return out
}

// UnseenCharges returns, per message ID, how many of the attempts the
// broker counted for lost leases were charged where no running consumer
// knew of the delivery: its instance had crashed (Instance.Crash), or the
// Receive that took it failed after taking effect, so its answer never
// reached the consumer. driver.Message.Attempt lets a broker count a lost
// delivery of a message that may have been running; no consumer can tell
// these from runs that killed their process, so a consumer bounding a
// crash loop (a message arriving past MaxAttempts+1 is dead-lettered
// unrun) may dead-letter such a message without a run. A lease lost while
// a live consumer held it is not among them: that consumer knows whether
// it ran the message.
func (b *Broker) UnseenCharges() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]int{}
	for _, r := range b.recs {
		if r.unseen > 0 {
			out[r.msg.ID] += r.unseen
		}
	}
	return out
}

// Unsettled returns the IDs of messages neither acknowledged nor
// dead-lettered, in publish order.
func (b *Broker) Unsettled() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, r := range b.recs {
		if !r.settled() {
			out = append(out, r.msg.ID)
		}
	}
	return out
}

// Revoke takes every message whose key selected reports true away from
// inst, as a rebalance moves a partition: when inst's driver is
// driver.Revocable (and the portable layer set its revoke function), it is
// told first and synchronously; then the broker takes the leases back (a
// message that may have been running counts an attempt), so another
// instance can receive them. It returns the messages the revoke function
// reported still running. Never call it from inside a driver call.
//
// While it runs, a Receive of inst that was under way when it began may
// still return selected messages (as a Kafka fetch under way does), and
// the portable layer must not run them; a Receive begun after it began
// returns none (a driver stops handing out a revoked partition before it
// calls revoke: once revoke has returned, "no selected message that had
// not started will start in this process", driver.Revocable, which no
// consumer can keep for a message handed out after it returned). Once the
// leases are taken back, a Receive begun before then fails retryably
// without effect (a rebalance ends a poll) rather than return messages
// the broker handed out anew, which the portable layer could not tell
// from those the revocation took back.
func (b *Broker) Revoke(ctx context.Context, inst *Instance, selected func(key string) bool) []*driver.Message {
	inst.mu.Lock()
	revoke := inst.revoke
	inst.mu.Unlock()
	b.mu.Lock()
	b.trace("revoke from instance %d begins", inst.id)
	inst.revokes++
	rv := &revoking{n: inst.revokes, selected: selected}
	inst.revoking = append(inst.revoking, rv)
	b.mu.Unlock()
	var still []*driver.Message
	if revoke != nil && b.cfg.Revocable {
		still = revoke(ctx, func(m *driver.Message) bool { return selected(m.Key) })
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.trace("revoke from instance %d: the portable layer returned (%d still running); leases taken back", inst.id, len(still))
	inst.revokes++
	rv.done = inst.revokes
	var gone []*lease
	for _, l := range b.leases {
		if l.inst == inst && selected(l.r.msg.Key) {
			gone = append(gone, l)
		}
	}
	slices.SortFunc(gone, func(x, y *lease) int { return x.r.seq - y.r.seq })
	for _, l := range gone {
		if b.leases[l.id] == l {
			b.lose(l)
		}
	}
	b.signal()
	return still
}

// Topic returns the broker's publishing driver.
func (b *Broker) Topic() driver.Topic {
	if b.cfg.MixedKeys {
		return mixedTopic{topic{b}}
	}
	return topic{b}
}

type topic struct{ b *Broker }

type mixedTopic struct{ topic }

func (mixedTopic) SendsMixedKeys() bool { return true }

func (t topic) SendBatch(ctx context.Context, ms []*driver.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t.b.publish(ms)
	return nil
}

func (topic) Limits() driver.Limits { return driver.Limits{} }

func (topic) IsRetryable(err error) bool { return errors.Is(err, ErrTransient) }

func (topic) ErrorCode(err error) keyorder.ErrorCode { return code(err) }

func (topic) Close() error { return nil }

func code(err error) keyorder.ErrorCode {
	switch {
	case errors.Is(err, ErrTransient):
		return keyorder.CodeUnavailable
	case errors.Is(err, ErrLeaseLost), errors.Is(err, ErrCrashed):
		return keyorder.CodeFailedPrecondition
	}
	return keyorder.Code(err)
}
