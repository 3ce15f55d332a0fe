package subscribe

// This file: the receive pump, which pulls from the driver into the lanes
// under flow control (one token per outstanding message).

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/lanes"
	"github.com/keyorder/keyorder/policy"
)

// item is one received message on its way through the lanes.
type item struct {
	m       *driver.Message
	attempt int
	chain   *chain
	seq     uint64 // receive order
	// due is when the retry of a message that failed here and waits in
	// process is due, as time since Subscriber.born (see returned).
	due time.Duration
	// key is the in-process group (lane key): the broker's key, refined
	// by Config.LaneKey; fair is the fairness key. Set at receive.
	key, fair string

	lost atomic.Bool // beside the flags below: no padding between them
	// fenced: the driver found its lease lost while the handler ran
	// (driver.Attempt.LeaseLost): it is not settled even if the handler
	// succeeds, since another consumer may hold it now.
	fenced atomic.Bool
	// revoking: revoked while its handler ran (see revoke.go): revoke
	// waits until the run's result has reached the driver
	// (Subscriber.revokeWaits).
	revoking atomic.Bool
	// Guarded by Subscriber.mu.
	hasToken bool // holds a flow-control token
	held     bool // outstanding without a token: counted in Subscriber.held
	parked   bool // counted in its key's keyHold.parked
	// inHold: outstanding under holdKeys, so listed on its key's keyHold
	// (hold), whose items prevK and nextK link.
	inHold       bool
	hold         *keyHold
	prevK, nextK *item
	// inOut: in Subscriber.outstanding, whose items prevO and nextO link.
	inOut        bool
	prevO, nextO *item
	// round is closed when the last lease renewal that included the item
	// has returned.
	round chan struct{}

	mu sync.Mutex
	// hctx is the context of the attempt running the item (alone, or in
	// a batch with others), cancelled when its lease is lost; nil when
	// none runs.
	hctx *attemptCtx
	// actx is the context of the first attempt the item runs, or heads
	// as a batch's first member (attemptCtx); later attempts get their
	// own, since a handler may keep the one it was given.
	actx attemptCtx

	// d is the first attempt's Delivery, allocated with the item; later
	// attempts get their own, since a handler may keep the one it was given.
	d      keyorder.Delivery
	called bool
	// unrun counts the handler starts recorded for it
	// (driver.StartRecorder) that its handler never came to: a RunBatch
	// batch is recorded with all its members, and those behind a failed
	// one were not handled (keyorder.FailedAt). The broker's count holds
	// them, the item's attempt does not (see unrunNote). Its lane's.
	unrun uint16
	// dp is the Delivery of the attempt running (or last run): how
	// driver.Attempt.Message finds the member of a Delivery.
	dp *keyorder.Delivery
	// first is the payload of the first attempt, copied at receive where
	// each attempt gets its own copy (see Subscriber.delivery); taken by
	// that attempt.
	first []byte
	// started is the argument of driver.StartRecorder.Started for a run
	// of the item alone (see Subscriber.started): set at receive, never
	// written again.
	started [1]*driver.Message
}

// chain links consecutive messages of one key received together from a
// native-hold broker; when one fails under Ordered the rest go back, or,
// under Capabilities.HoldChains, wait in process behind its retry.
type chain struct{ broken atomic.Bool }

// holdsChain reports whether a failed it is retried in process, the rest
// of its chain waiting behind it (Capabilities.HoldChains), rather than
// returned to the broker with the rest given back. Every member of a chain
// is: the last one too, since with lane keys (Config.LaneKey) the members
// run in several lanes and a member retried in process may still wait
// while the last fails, and a message once retried in process must stay
// there (a Nack would count one attempt for all its runs).
func (s *Subscriber) holdsChain(it *item) bool {
	return s.caps.HoldChains && it.chain != nil
}

// itemSlab is how many items the pump allocates at once (Subscriber.items).
// Items are never reused: an item lives as long as anything reaches it (a
// lane, the acker, a handler that kept its Delivery or ctx, both part of
// the item). One long-lived item (a Delivery a handler keeps, a message
// held for a retry) keeps up to itemSlab-1 finished neighbours, and the
// messages they point to, from being freed with it (see internal/slab).
// Nine 448-byte items fill a 4,096-byte size class to within 64 bytes
// (eight left 512 bytes of it empty); TestItemSlabSizeClass keeps a slab
// filling its class as item changes.
const itemSlab = 9

// pump receives messages and submits them to the lanes until ctx ends or a
// permanent error occurs.
func (s *Subscriber) pump(ctx context.Context, pool *lanes.Pool[*item]) error {
	failures := 0
	var its []*item
	var lits []lanes.Item
	for {
		n, err := s.acquire(ctx)
		if err != nil {
			return nil
		}
		if err := s.waitHeld(ctx); err != nil {
			s.releaseTokens(n)
			return nil
		}
		gen := s.revokeGen.Load() // revocations begun or ended before this Receive
		ms, err := s.drv.Receive(ctx, n)
		if len(ms) > n {
			// A driver broke its contract; the extra messages carry no
			// token rather than releasing tokens never taken (which would
			// block the pump for good).
			s.cfg.Logger.Error("keyorder: driver returned more messages than asked", "asked", n, "got", len(ms))
		}
		s.releaseTokens(n - min(len(ms), n))
		if err != nil && len(ms) > 0 && s.caps.NativeHold && ctx.Err() != nil {
			// Received as Run stops: they run with the rest before Run
			// returns (see drain).
			err = nil
		}
		if err != nil && len(ms) > 0 {
			// Messages that came with an error go back unhandled; their
			// tokens with them.
			its = its[:0]
			for i, m := range ms {
				its = append(its, &item{m: m, hasToken: i < n})
			}
			s.giveBack(its)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !s.drv.IsRetryable(err) {
				return &keyorder.Error{Code: s.drv.ErrorCode(err), Op: "receive", Err: err}
			}
			failures++
			s.cfg.Logger.Warn("keyorder: receive failed; retrying", "err", err, "failures", failures)
			t := time.NewTimer(s.cfg.Retry.Backoff(failures))
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			continue
		}
		failures = 0
		// Link chains before any item reaches a lane.
		clear(its)
		its = its[:0]
		var prev *item
		for i, m := range ms {
			s.seq++
			it := s.items.Next()
			it.m, it.attempt, it.hasToken, it.seq = m, max(m.Attempt, 1), i < n, s.seq
			s.takeUnrun(it)
			it.started[0] = m
			if s.copiesPayload() {
				it.first = s.payloads.Copy(m.Payload)
			}
			s.classify(it)
			if s.caps.NativeHold && s.caps.Ordering == policy.Ordered && m.Key != "" {
				if prev != nil && prev.m.Key == m.Key {
					if prev.chain == nil {
						prev.chain = &chain{}
					}
					it.chain = prev.chain
				}
				prev = it
			}
			its = append(its, it)
		}
		// One lock for the batch's bookkeeping, one release of the tokens
		// of those waiting on time, one submission to the lanes.
		now := time.Now()
		free := 0
		s.mu.Lock()
		for _, it := range its {
			s.addOutstanding(it)
			switch {
			case it.m.NotBefore.After(now):
				// Waiting on time, like a retry: held, not counted.
				// Under holdKeys it parks its key.
				free += s.untoken(it)
				if it.inHold {
					it.parked = true
					it.hold.parked++
				}
			case it.inHold && it.hold.parked > 0:
				// Behind a parked head of its key: held.
				free += s.untoken(it)
			}
		}
		if len(s.revocations) > 0 {
			free += s.revokeReceived(its, gen)
		}
		s.mu.Unlock()
		s.releaseTokens(free)
		if s.batcher == nil {
			lits = lits[:0]
			for _, it := range its {
				lits = append(lits, lanes.Item{Key: it.key, Keyed: it.key != "", NotBefore: it.m.NotBefore, Fairness: it.fair})
			}
			n, err := pool.SubmitAll(ctx, lits, its)
			clear(lits)
			if err != nil {
				// Shutting down: give the rest back unhandled, all of
				// them, so that none of a key is handled after one
				// before it went back.
				s.giveBack(its[n:])
			}
			continue
		}
		for i, it := range its {
			if err := s.batcher.add(ctx, it); err != nil {
				s.giveBack(its[i+1:]) // the batcher gave back its batch
				break
			}
		}
		if s.batcher != nil && s.caps.NativeHold {
			// Nothing more of these keys comes while they are leased:
			// their batches are as full as they get.
			s.batcher.flushAll(ctx)
		}
	}
}

// giveBack returns received items to the broker unhandled, without counting
// an attempt, and forgets them.
func (s *Subscriber) giveBack(its []*item) {
	ms := make([]*driver.Message, 0, len(its))
	for _, it := range its {
		ms = append(ms, it.m)
	}
	if len(ms) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.detach(its...)
	for _, it := range its {
		s.noteUnrun(it)
	}
	err := s.retrySettle(ctx, func(ctx context.Context) error { return s.drv.Release(ctx, ms) })
	if err != nil {
		s.stats.SettleFailures.Add(1)
		s.cfg.Logger.Warn("keyorder: returning unhandled messages failed; the broker will redeliver them", "count", len(ms), "err", err)
	}
	s.forgetAll(its)
}

// detach takes items out of outstanding before they are handed back (Nack,
// Release, DeadLetter), so no later lease renewal includes them, and waits
// for a renewal under way that does: on brokers where a renewal and a
// hand-back both set a message's visibility, a renewal reaching the broker
// after the hand-back would undo it.
func (s *Subscriber) detach(its ...*item) {
	s.mu.Lock()
	for _, it := range its {
		s.removeOutstanding(it)
	}
	s.mu.Unlock()
	for _, it := range its {
		if it.round != nil {
			<-it.round
		}
	}
}

// acquire takes one flow-control token (blocking) and as many more as are
// free, up to a receive batch.
func (s *Subscriber) acquire(ctx context.Context) (int, error) {
	return s.tokens.acquire(ctx, s.caps.MaxBatch)
}

// waitHeld returns once fewer than Config.MaxHeld received messages are
// held in process without a token, or ctx ends. The pump calls it with
// its tokens taken, just before it receives, so that what it receives
// keeps the process within MaxOutstanding+MaxHeld messages: tokens bound
// the messages that may run, this bound those that wait (see "Held keys"
// in the package documentation). While it waits nothing is received, on
// any key; it ends when held messages have run (a held key's backlog when
// its head's time has come).
func (s *Subscriber) waitHeld(ctx context.Context) error {
	paused := false
	for {
		s.mu.Lock()
		held := s.held
		s.heldWait = held >= s.cfg.MaxHeld
		s.mu.Unlock()
		if held < s.cfg.MaxHeld {
			if paused {
				s.cfg.Logger.Info("keyorder: receiving again", "held", held, "max_held", s.cfg.MaxHeld)
			}
			return nil
		}
		if !paused {
			paused = true
			s.cfg.Logger.Warn("keyorder: Config.MaxHeld messages wait in process (behind held keys, or on a retry or not-before time); receiving paused until some have run",
				"held", held, "max_held", s.cfg.MaxHeld)
		}
		select {
		case <-s.heldRoom:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (s *Subscriber) releaseTokens(n int) { s.tokens.release(n) }

// tokens is the flow-control semaphore: Config.MaxOutstanding tokens, one
// per outstanding message that may run. The pump is its only taker and
// takes a receive batch's worth at once; settlements give tokens back, the
// acker a whole acknowledged batch's at once. A counter under a mutex
// rather than a channel of tokens: one operation per batch either way,
// where a channel costs one per token.
type tokens struct {
	size    int // Config.MaxOutstanding
	mu      sync.Mutex
	free    int  // tokens not taken
	waiting bool // the taker waits for wake
	wake    chan struct{}
}

func newTokens(n int) *tokens {
	return &tokens{size: n, free: n, wake: make(chan struct{}, 1)}
}

// acquire takes one token, waiting for it until ctx ends, and as many more
// as are free, up to max in all.
func (t *tokens) acquire(ctx context.Context, max int) (int, error) {
	for {
		t.mu.Lock()
		if t.free > 0 {
			n := min(t.free, max)
			t.free -= n
			t.waiting = false
			t.mu.Unlock()
			return n, nil
		}
		t.waiting = true
		t.mu.Unlock()
		select {
		case <-t.wake:
		case <-ctx.Done():
			t.mu.Lock()
			t.waiting = false
			t.mu.Unlock()
			return 0, ctx.Err()
		}
	}
}

// release gives back n tokens, waking a waiting taker.
func (t *tokens) release(n int) {
	if n <= 0 {
		return
	}
	t.mu.Lock()
	t.free += n
	wake := t.waiting
	t.waiting = false
	t.mu.Unlock()
	if wake {
		select {
		case t.wake <- struct{}{}:
		default:
		}
	}
}
