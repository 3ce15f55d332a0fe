// Package publish is the portable publishing API of keyorder.
//
// A Publisher wraps a backend's driver (see New) and owns what must be
// the same on every broker: resolving a message's ordering key, validating
// the message against the backend's limits before anything is sent, keeping
// one batch per key in flight so a key's messages reach the broker in the
// order the application published them, and pausing a key whose publish
// failed so that nothing published after it can overtake it.
//
// # Ordering
//
// Key resolution, first that is set wins: Message.Key, then the
// partition-key header, then the key defined at the mount site: Config.KeyFunc
// (a composite key such as (tenant, account); see keyorder.CompositeKey) or
// the fixed Config.Key. A KeyFunc that reports a missing part follows
// Config.MissingKey: Reject fails the publish with a *keyorder.MissingKeyError
// naming the part (matching keyorder.ErrMissingKey); Unordered sends the
// message without a key. A key definition is fixed for a subscription's
// life: see keyorder.KeyFunc. The key travels as the broker's
// ordering construct, never as a header. Concurrent publishes of one key are
// queued and sent in the order they were accepted, in batches of up to
// Config.MaxBatch, one batch at a time; keyless messages are sent
// concurrently.
//
// # Combined sends
//
// Most brokers take one key per request, so each key is sent on its own:
// a PublishBatch over 1,000 keys makes 1,000 requests. A driver that
// declares it accepts several keys in one request (PostgreSQL's does) gets
// the batches of the keys that are ready at the same time combined into
// one request instead, up to Config.MaxBatch messages and the backend's
// byte limit, with at most CombinedSendsInFlight such requests in flight.
// Nothing waits to be combined: a key with messages queued and nothing in
// flight goes at once while fewer requests are in flight, else in the next
// request to start, with every key that became ready meanwhile (a key that
// lingers, see Config.Linger, becomes ready when its linger ends). Every
// guarantee above holds per key as before: one batch per key in flight, and
// a failed request fails (retries, pauses) every key in it as a failed
// batch of one
// key does.
//
// # Asynchronous publishing
//
// PublishAsync queues a message and returns a *Result at once, without
// waiting for the broker; Result.Get (or Result.Ready) tells the outcome.
// A key's messages published one after another with PublishAsync reach the
// broker in that order, and what queues while a key's batch is in flight
// goes in its next batch, so one goroutine can keep every key busy. Publish
// is PublishAsync followed by Result.Get. A key's first batch goes at once
// unless Config.Linger asks it to wait for more of the key.
//
// Memory is bounded: Config.MaxOutstandingMessages and
// Config.MaxOutstandingBytes limit the messages accepted and not yet
// settled (sent or failed). A publish that would exceed a limit blocks in
// PublishAsync (or Publish, PublishBatch) until enough earlier messages have
// settled. Blocked publishes are admitted strictly in arrival order (FIFO),
// so a small message never overtakes a large one that waits. A blocked
// publish whose context ends returns the context's error and sends nothing.
// A message or batch larger than a limit is admitted alone, once nothing
// else is outstanding.
//
// # Paused keys
//
// When a keyed batch fails (after retrying transient errors), the key is
// paused: that batch's callers get the error, and every later publish of the
// key fails fast with an error matching keyorder.ErrKeyPaused, sending
// nothing, until Resume or ResumeAll. With Config.AutoResume the key is
// resumed at once instead, so the next publish is sent; messages already
// queued behind the failed batch (or blocked waiting for admission) still
// fail with ErrKeyPaused, because sending them would let them overtake the
// failed one.
package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/driverkit"
	"github.com/keyorder/keyorder/internal/slab"
	"github.com/keyorder/keyorder/policy"
)

// Defaults for Config.
const (
	MaxBatchDefault    = 100
	SendRetriesDefault = 3
	// MaxOutstandingMessagesDefault bounds the messages accepted and not
	// yet settled. Each holds about half a kilobyte besides its payload
	// (about 50 MB at the limit). The window is shared by the keys in
	// flight, and a key's next batch is what queued while its batch was
	// in flight, so a small window makes small batches when many keys
	// publish at once: 10,000 over 1,000 keys sent about 4 requests a key
	// where 100,000 sends 2, as many as the Pub/Sub client, which does not
	// bound what it queues by default.
	MaxOutstandingMessagesDefault = 100_000
	// MaxOutstandingBytesDefault bounds their bytes (64 MiB).
	MaxOutstandingBytesDefault = 64 << 20
)

// Config configures a Publisher. A nil *Config means all defaults.
type Config struct {
	// Key is the ordering key fixed at the mount site: used when neither
	// Message.Key nor the partition-key header is set.
	Key string
	// KeyFunc derives the key of a message that has neither Message.Key nor
	// the partition-key header: a composite key over headers, the fairness
	// key or the payload (see keyorder.CompositeKey). Nil means none; it
	// may not be set together with Key.
	KeyFunc keyorder.KeyFunc
	// MissingKey is what happens to a message with no key. Defaults to
	// policy.Reject.
	MissingKey policy.MissingKey
	// AutoResume resumes a key right after a failed publish instead of
	// pausing it.
	AutoResume bool
	// MaxBatch is the most messages of one key sent in one batch, and on a
	// driver that combines keys (see "Combined sends") the most messages
	// of one request. Defaults to MaxBatchDefault, capped by the backend's
	// limit.
	MaxBatch int
	// SendRetries is how many times a transient send error is retried.
	// Defaults to SendRetriesDefault; a negative value disables retries.
	SendRetries int
	// Backoff spaces the retries. Defaults to policy.Retry defaults.
	Backoff policy.Retry
	// Linger is how long a key's first batch waits for more of the key's
	// messages before it is sent, when the key has nothing in flight
	// (later batches go as soon as the one before them is settled, with
	// what queued meanwhile; on a driver that combines keys, in the next
	// request that has room). It trades latency for fewer, fuller
	// requests when many keys publish a few messages each through
	// PublishAsync; a batch that reaches MaxBatch goes at once. Zero (the
	// default) sends at once; a synchronous Publish on an idle key waits
	// up to Linger too. Close ends every such wait at once.
	Linger time.Duration
	// MaxOutstandingMessages is the most messages accepted (by PublishAsync,
	// Publish or PublishBatch) and not yet settled, sent or failed. A
	// publish that would exceed it blocks until earlier messages settle
	// (see the package documentation). Defaults to
	// MaxOutstandingMessagesDefault; a negative value means no limit.
	MaxOutstandingMessages int
	// MaxOutstandingBytes is the most bytes of such messages (payload, key,
	// ID, header names and values). Defaults to MaxOutstandingBytesDefault;
	// a negative value means no limit.
	MaxOutstandingBytes int
	// Logger receives the publisher's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Observer sees each message published, for tracing and metrics (see
	// module github.com/keyorder/keyorder/otelkeyorder). Nil means none,
	// and costs one nil check per message.
	Observer Observer
}

// WithDefaults returns a copy of c with defaults applied.
func (c *Config) WithDefaults() *Config {
	out := &Config{}
	if c != nil {
		*out = *c
	}
	if out.MissingKey == policy.MissingKeyDefault {
		out.MissingKey = policy.Reject
	}
	if out.MaxBatch == 0 {
		out.MaxBatch = MaxBatchDefault
	}
	if out.SendRetries == 0 {
		out.SendRetries = SendRetriesDefault
	}
	if out.SendRetries < 0 {
		out.SendRetries = 0
	}
	if out.MaxOutstandingMessages == 0 {
		out.MaxOutstandingMessages = MaxOutstandingMessagesDefault
	}
	if out.MaxOutstandingBytes == 0 {
		out.MaxOutstandingBytes = MaxOutstandingBytesDefault
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

func (c *Config) validate() error {
	if c.KeyFunc != nil && c.Key != "" {
		return fmt.Errorf("%w: publish.Config.Key and publish.Config.KeyFunc are both set; choose one key definition", keyorder.ErrInvalidConfig)
	}
	if !c.MissingKey.Valid() {
		return fmt.Errorf("%w: publish.Config.MissingKey: unknown missing-key policy %d", keyorder.ErrInvalidConfig, int(c.MissingKey))
	}
	if c.MaxBatch < 0 {
		return fmt.Errorf("%w: publish.Config.MaxBatch must be positive, got %d", keyorder.ErrInvalidConfig, c.MaxBatch)
	}
	if c.Linger < 0 {
		return fmt.Errorf("%w: publish.Config.Linger must not be negative, got %v", keyorder.ErrInvalidConfig, c.Linger)
	}
	if err := c.Backoff.Validate(); err != nil {
		return fmt.Errorf("%w: publish.Config.Backoff: %v", keyorder.ErrInvalidConfig, err)
	}
	return nil
}

// CombinedSendsInFlight is how many requests that combine keys a Publisher
// keeps in flight at most, on a driver that combines keys (see "Combined
// sends"). What becomes ready while they run waits for one of them to
// finish and then goes in one request. More than one keeps a slow request
// (a retry's backoff) from holding up every other key; PostgreSQL's pool
// holds at least 4 connections by default.
const CombinedSendsInFlight = 4

// Publisher publishes messages to one topic. It is safe for concurrent use.
type Publisher struct {
	drv    driver.Topic
	cfg    *Config
	limits driver.Limits
	// combine is set when the driver sends several keys in one call
	// (driver.MixedKeySender).
	combine bool

	mu     sync.Mutex
	closed bool
	keys   map[string]*keyQueue
	spare  []*keyQueue // finished queues kept for reuse
	paused map[string]error
	flow   flow // outstanding messages and bytes, blocked publishes
	// ready holds, when combine is set, the keys with queued messages and
	// no batch in flight or lingering, oldest first, from readyHead on;
	// calls counts the combined sends in flight (at most
	// CombinedSendsInFlight).
	ready     []*keyQueue
	readyHead int
	calls     int
	senders   sync.WaitGroup
	// closing is closed when Close starts: a lingering first batch goes at
	// once.
	closing chan struct{}
	stop    context.CancelFunc
	ctx     context.Context

	unobserve func() // from Config.Observer.Attach

	// payloads holds the copies of small payloads (payloadChunk bytes at a
	// time), guarded by payloadsMu.
	payloadsMu sync.Mutex
	payloads   slab.Bytes
}

// payloadChunk is how many bytes of payload copies one allocation holds.
// Publishes whose payloads are small (up to a quarter of it) share chunks,
// so copying a payload seldom allocates; a chunk lives until none of the
// messages cut from it is referenced (a kept Result references its
// message).
const payloadChunk = 4096

type keyQueue struct {
	// key is the key being sent (set under Publisher.mu before send
	// starts); send runs p.sendKey(key, kq). It is built once per
	// keyQueue, which is reused through Publisher.spare, so starting a
	// sender (go kq.send()) allocates no closure per message.
	key     string
	send    func()
	pending []*request
	batch   []*request        // the batch in flight
	ms      []*driver.Message // its messages, for the driver
	// full is signalled (under Publisher.mu) when pending reaches
	// MaxBatch while the sender lingers; nil otherwise.
	full chan struct{}
	// With Publisher.combine: inCall is set while a batch of the key is in
	// a send, lingering while its first batch lingers, isReady while it is
	// in Publisher.ready. A key is in exactly one of these states while it
	// is in Publisher.keys.
	inCall, lingering, isReady bool
}

// spareMax bounds the finished key queues kept for reuse.
const spareMax = 1024

type request struct {
	m    *driver.Message // &msg
	msg  driver.Message  // allocated with the request
	size int             // counted against MaxOutstandingBytes
	res  *Result         // set for PublishAsync
	c    *call           // set for PublishBatch
	end  func(error)     // from Config.Observer.StartPublish
}

// call is one PublishBatch waiting for its requests.
type call struct {
	mu   sync.Mutex
	left int
	errs []error
	done chan struct{} // closed when left reaches 0
}

// finish records the outcome of r. The request may be reused (its Result
// read) as soon as finish returns.
func (r *request) finish(err error) {
	if r.end != nil {
		r.end(err)
		r.end = nil
	}
	if r.res != nil {
		r.res.settle(err)
		return
	}
	c := r.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil && !slices.ContainsFunc(c.errs, func(e error) bool { return e == err }) {
		c.errs = append(c.errs, err)
	}
	if c.left--; c.left == 0 {
		close(c.done)
	}
}

// Open opens a Publisher for the topic named by urlstr, through the scheme
// registered on driver.DefaultMux (import the adapter for side effects).
func Open(ctx context.Context, urlstr string, cfg *Config) (*Publisher, error) {
	drv, err := driver.DefaultMux().OpenTopic(ctx, urlstr)
	if err != nil {
		return nil, err
	}
	p, err := New(drv, cfg)
	if err != nil {
		drv.Close()
		return nil, err
	}
	return p, nil
}

// New returns a Publisher over a driver.
func New(drv driver.Topic, cfg *Config) (*Publisher, error) {
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	lim := drv.Limits()
	if lim.MaxBatchMessages > 0 && c.MaxBatch > lim.MaxBatchMessages {
		c.MaxBatch = lim.MaxBatchMessages
	}
	ctx, stop := context.WithCancel(context.Background())
	mk, _ := drv.(driver.MixedKeySender)
	p := &Publisher{
		drv: drv, cfg: c, limits: lim, combine: mk != nil && mk.SendsMixedKeys(),
		keys: map[string]*keyQueue{}, paused: map[string]error{},
		closing:  make(chan struct{}),
		payloads: slab.NewBytes(payloadChunk),
		ctx:      ctx, stop: stop,
	}
	if c.Observer != nil {
		p.unobserve = c.Observer.Attach(p)
	}
	return p, nil
}

// Limits returns the backend's message limits.
func (p *Publisher) Limits() keyorder.Limits { return p.limits }

// Publish sends one message and waits until the broker has it; it returns
// the message's ID (m.ID, or the UUIDv7 assigned to the copy it sends when
// m.ID is empty; m is never modified, and neither m nor its Payload or
// Headers is retained once Publish returns, as PublishAsync describes). It is PublishAsync followed by
// Result.Get: see them for the ordering and blocking rules. The error is
// typed: a message that breaks a rule fails before anything is sent
// (keyorder.ErrMissingKey, *keyorder.LimitError matching
// keyorder.ErrInvalidMessage); a paused key fails with
// *keyorder.KeyPausedError; a broker error comes back as *keyorder.Error. A
// message still unsent when Close gives up fails with an error matching
// keyorder.ErrClosed. If ctx is already done, Publish returns ctx.Err() and
// sends nothing. If ctx ends while the message waits for its key's batch in
// flight, Publish returns its ID and ctx.Err(), and the message stays
// queued in its place and is sent (so a later publish of the key never
// overtakes it).
func (p *Publisher) Publish(ctx context.Context, m *keyorder.Message) (string, error) {
	return p.PublishAsync(ctx, m).Get(ctx)
}

// PublishBatch publishes several messages and waits until the broker has
// them (or they failed). It returns their IDs, ids[i] being ms[i]'s (as
// Publish assigns them; ms is not modified nor retained: the messages
// sent are copies, payloads included). Every message is validated
// first: if one is invalid, nothing is sent, ids is nil and the error names
// its index. The batch is admitted as one unit under the outstanding
// limits. Messages of one key are sent in slice order; the error joins the
// errors of the keys that failed.
func (p *Publisher) PublishBatch(ctx context.Context, ms []*keyorder.Message) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(ms) == 0 {
		return nil, nil
	}
	reqs := make([]request, len(ms))
	ptrs := make([]*request, len(ms))
	ids := make([]string, len(ms))
	c := &call{left: len(ms), done: make(chan struct{})}
	for i, m := range ms {
		r := &reqs[i]
		if err := p.prepare(r, m); err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		r.size, r.c = msgSize(r.m), c
		ptrs[i] = r
		ids[i] = r.m.ID
	}
	p.ownPayloads(ptrs)
	if p.cfg.Observer != nil {
		if err := p.observe(ctx, ptrs); err != nil {
			return nil, err
		}
	}
	if err := p.admit(ctx, ptrs); err != nil {
		return nil, endAll(ptrs, err)
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		return ids, ctx.Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return ids, errors.Join(c.errs...)
}

// observe starts the observation of each request's message
// (Config.Observer) and validates each again, since the observer may have
// added headers (a trace context) that break the backend's header limits;
// the sizes counted against MaxOutstandingBytes are taken again too. If one
// fails, every observation ends with its error, nothing is sent, and the
// error names the message's index when there are several.
func (p *Publisher) observe(ctx context.Context, rs []*request) error {
	for _, r := range rs {
		// The observer sees the message as the application wrote it (with
		// its resolved key and ID); headers it adds go on the copy sent.
		km := &keyorder.Message{ID: r.m.ID, Key: r.m.Key, Payload: r.m.Payload, Headers: r.m.Headers, NotBefore: r.m.NotBefore}
		r.end = p.cfg.Observer.StartPublish(ctx, km)
		r.m.Headers = km.Headers
	}
	for i, r := range rs {
		if err := driver.Validate(p.limits, r.m); err != nil {
			err = fmt.Errorf("with the headers added by publish.Config.Observer: %w", err)
			if len(rs) > 1 {
				err = fmt.Errorf("message %d: %w", i, err)
			}
			return endAll(rs, err)
		}
		r.size = msgSize(r.m)
	}
	return nil
}

// endAll ends the observations of requests that fail before being queued.
func endAll(rs []*request, err error) error {
	for _, r := range rs {
		if r.end != nil {
			r.end(err)
			r.end = nil
		}
	}
	return err
}

// prepare resolves the key, validates and converts m into r's driver
// message (r.m points to r.msg afterwards), exactly as every other
// publishing path does (driver.Prepare).
func (p *Publisher) prepare(r *request, m *keyorder.Message) error {
	key := p.cfg.Key
	if p.cfg.KeyFunc != nil && m != nil && m.Key == "" && m.Headers[keyorder.HeaderPartitionKey] == "" {
		k, err := p.cfg.KeyFunc(m)
		switch {
		case err == nil:
			key = k
		case errors.Is(err, keyorder.ErrMissingKey) && p.cfg.MissingKey != policy.Reject:
			key = ""
		case errors.Is(err, keyorder.ErrMissingKey):
			return err
		default:
			return fmt.Errorf("%w: publish.Config.KeyFunc: %w", keyorder.ErrInvalidMessage, err)
		}
	}
	r.m = &r.msg
	return driverkit.PrepareTo(r.m, m, key, p.cfg.MissingKey == policy.Reject, p.limits)
}

// pausedLocked returns the error of the first paused key among rs; p.mu is
// held.
func (p *Publisher) pausedLocked(rs []*request) error {
	if len(p.paused) == 0 {
		return nil
	}
	for _, r := range rs {
		if cause, ok := p.paused[r.m.Key]; ok && r.m.Key != "" {
			return &keyorder.KeyPausedError{Key: r.m.Key, Cause: cause}
		}
	}
	return nil
}

// queueLocked queues admitted requests behind their keys' in-flight
// batches, starting a sender where a key has none; p.mu is held.
func (p *Publisher) queueLocked(rs []*request) {
	var keyless []*request
	for _, r := range rs {
		p.flow.msgs++
		p.flow.bytes += r.size
		key := r.m.Key
		if key == "" {
			keyless = append(keyless, r)
			continue
		}
		kq, ok := p.keys[key]
		if !ok {
			if n := len(p.spare); n > 0 {
				kq = p.spare[n-1]
				p.spare[n-1] = nil
				p.spare = p.spare[:n-1]
			} else {
				kq = p.newKeyQueue()
			}
			kq.key = key
			p.keys[key] = kq
			switch {
			case !p.combine:
				p.senders.Add(1)
				go kq.send()
			case p.cfg.Linger > 0:
				kq.lingering = true
				p.senders.Add(1)
				go p.lingerKey(kq)
			}
		}
		kq.pending = append(kq.pending, r)
		if p.combine {
			p.readyLocked(kq)
		}
		if kq.full != nil && len(kq.pending) >= p.cfg.MaxBatch {
			close(kq.full)
			kq.full = nil
		}
	}
	if p.combine {
		p.startSendsLocked()
	}
	if len(keyless) > 0 {
		p.senders.Add(1)
		go p.sendKeyless(keyless)
	}
}

// newKeyQueue returns a new keyQueue with its send func built.
func (p *Publisher) newKeyQueue() *keyQueue {
	kq := &keyQueue{}
	kq.send = func() { p.sendKey(kq.key, kq) }
	return kq
}

// sendKey sends a key's queued requests one batch at a time until none is
// left; at most one sendKey runs per key.
func (p *Publisher) sendKey(key string, kq *keyQueue) {
	defer p.senders.Done()
	if p.cfg.Linger > 0 {
		p.linger(kq)
	}
	settled, settledBytes := 0, 0 // finished, not yet released from flow
	for {
		p.mu.Lock()
		if settled > 0 {
			p.releaseLocked(settled, settledBytes)
			settled, settledBytes = 0, 0
		}
		if len(kq.pending) == 0 {
			p.dropKeyLocked(kq)
			p.mu.Unlock()
			return
		}
		n := min(len(kq.pending), p.cfg.MaxBatch)
		n = p.fitBytes(kq.pending[:n])
		kq.batch = append(kq.batch[:0], kq.pending[:n]...)
		if n == len(kq.pending) {
			clear(kq.pending)
			kq.pending = kq.pending[:0]
		} else {
			kq.pending = kq.pending[n:]
		}
		batch := kq.batch
		p.mu.Unlock()

		err := p.send(batch, &kq.ms)
		settled = len(batch)
		for _, r := range batch {
			settledBytes += r.size
		}
		if err == nil {
			for _, r := range batch {
				r.finish(nil)
			}
			clear(batch)
			continue
		}
		// Pause (and fail what queued behind the batch, or waits to be
		// admitted) before the callers hear of the failure, so a publish
		// they make next sees the pause, or under AutoResume is sent.
		p.mu.Lock()
		if !p.cfg.AutoResume {
			p.paused[key] = err
		}
		perr := &keyorder.KeyPausedError{Key: key, Cause: err}
		for _, r := range kq.pending {
			settled++
			settledBytes += r.size
			r.finish(perr)
		}
		clear(kq.pending)
		kq.pending = kq.pending[:0]
		p.failWaitingLocked(key, perr)
		p.releaseLocked(settled, settledBytes)
		settled, settledBytes = 0, 0
		p.mu.Unlock()
		for _, r := range batch {
			r.finish(err)
		}
		clear(batch)
		p.cfg.Logger.Warn("keyorder: keyed publish failed", "key", key, "paused", !p.cfg.AutoResume, "err", err)
	}
}

// dropKeyLocked forgets a key that has nothing queued nor in flight,
// keeping its queue for reuse; p.mu is held.
func (p *Publisher) dropKeyLocked(kq *keyQueue) {
	delete(p.keys, kq.key)
	if len(p.spare) < spareMax {
		kq.key = ""
		kq.pending = kq.pending[:0]
		p.spare = append(p.spare, kq)
	}
}

// linger waits up to Config.Linger for a key's first batch to fill, or
// until Close starts.
func (p *Publisher) linger(kq *keyQueue) {
	p.mu.Lock()
	if len(kq.pending) >= p.cfg.MaxBatch {
		p.mu.Unlock()
		return
	}
	full := make(chan struct{})
	kq.full = full
	p.mu.Unlock()
	t := time.NewTimer(p.cfg.Linger)
	select {
	case <-full:
		t.Stop()
		return
	case <-t.C:
	case <-p.closing:
		t.Stop()
	}
	p.mu.Lock()
	if kq.full == full {
		kq.full = nil
	}
	p.mu.Unlock()
}

// fitBytes shortens a batch to the backend's byte limit (at least one).
func (p *Publisher) fitBytes(rs []*request) int {
	if p.limits.MaxBatchBytes <= 0 {
		return len(rs)
	}
	total := 0
	for i, r := range rs {
		total += len(r.m.Payload)
		if total > p.limits.MaxBatchBytes && i > 0 {
			return i
		}
	}
	return len(rs)
}

func (p *Publisher) sendKeyless(rs []*request) {
	defer p.senders.Done()
	var buf []*driver.Message
	for len(rs) > 0 {
		n := p.fitBytes(rs[:min(len(rs), p.cfg.MaxBatch)])
		err := p.send(rs[:n], &buf)
		bytes := 0
		for _, r := range rs[:n] {
			bytes += r.size
			r.finish(err)
		}
		p.mu.Lock()
		p.releaseLocked(n, bytes)
		p.mu.Unlock()
		rs = rs[n:]
	}
}

// send calls the driver, retrying transient errors. It builds the driver's
// slice in *buf, which it reuses.
func (p *Publisher) send(batch []*request, buf *[]*driver.Message) error {
	ms := (*buf)[:0]
	for _, r := range batch {
		ms = append(ms, r.m)
	}
	*buf = ms
	defer clear(ms)
	var err error
	for attempt := 1; ; attempt++ {
		err = p.drv.SendBatch(p.ctx, ms)
		if err == nil {
			return nil
		}
		if attempt > p.cfg.SendRetries || !p.drv.IsRetryable(err) || p.ctx.Err() != nil {
			break
		}
		t := time.NewTimer(p.cfg.Backoff.Backoff(attempt))
		select {
		case <-t.C:
		case <-p.ctx.Done():
			t.Stop()
		}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		if p.ctx.Err() != nil {
			// Close gave up waiting: no caller's context ended.
			return fmt.Errorf("%w: the publisher was closed before the send completed", keyorder.ErrClosed)
		}
		return err
	}
	return &keyorder.Error{Code: p.drv.ErrorCode(err), Op: "publish", Err: err}
}

// Paused returns the paused keys, sorted.
func (p *Publisher) Paused() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Sorted(maps.Keys(p.paused))
}

// Resume resumes a paused key; it reports whether the key was paused.
func (p *Publisher) Resume(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.paused[key]
	delete(p.paused, key)
	return ok
}

// ResumeAll resumes every paused key and returns how many there were.
func (p *Publisher) ResumeAll() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.paused)
	clear(p.paused)
	return n
}

// Close stops accepting messages (publishes blocked on the outstanding
// limits fail with keyorder.ErrClosed, sending nothing), sends what is
// queued at once (a batch waiting out Config.Linger stops waiting), waits
// for it to be sent until ctx ends (then sends in progress are cancelled
// and every message not sent fails with an error matching
// keyorder.ErrClosed, so none is lost silently) and closes the driver. It
// returns ctx's error when ctx ended first. Publishing after Close returns
// keyorder.ErrClosed.
func (p *Publisher) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return keyorder.ErrClosed
	}
	p.closed = true
	close(p.closing) // lingering batches go now
	p.failWaitingLocked("", keyorder.ErrClosed)
	p.mu.Unlock()
	done := make(chan struct{})
	go func() { p.senders.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
		p.stop()
		<-done
	}
	p.stop()
	if p.unobserve != nil {
		p.unobserve()
	}
	return errors.Join(err, p.drv.Close())
}
