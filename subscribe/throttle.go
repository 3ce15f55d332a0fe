package subscribe

// This file: throttles (token buckets per key, per fairness key, or per any
// function of the message), applied just before a handler runs.

import (
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/lanes"
)

// Throttle is a rate limit: a token bucket per value of By, refilled at
// Rate tokens a second up to Burst. Every handler call draws one token from
// the bucket of each Throttle that applies to its message.
//
// A message whose bucket is empty waits in process without running, and
// waiting is not a failure: it counts no attempt, holds no flow-control
// token (Config.MaxOutstanding), its lease is kept alive, and on brokers
// that hold groups natively (PostgreSQL, SQS) it is not handed back. Like a
// message waiting for its retry, it holds its own ordering group under
// Ordered (nothing behind it in the group runs first) and nothing under
// Parallel and Exclusive (later messages of its key may run, as far as the
// broker delivers them: under Exclusive a broker that holds groups natively
// delivers nothing more of the key while it waits). Other keys keep
// flowing. A message waiting on one bucket takes no token from the others.
//
// Under RunBatch a batch draws one token per message, from the buckets of
// its first message, but never more than a bucket's Burst: set Burst to at
// least Batch.MaxSize for an exact message rate (with a smaller Burst,
// batches pass at Rate/Burst a second, each up to MaxSize messages).
type Throttle struct {
	// By returns the bucket a message draws from: OrderingKey for one
	// bucket per ordering key, FairnessKeyHeader for one per fairness key
	// (tenant), or any function of the message. "" means the Throttle
	// does not apply to the message. Required.
	By MessageFunc
	// Rate is the refill rate in tokens per second. Required (> 0).
	Rate float64
	// Burst is the bucket's size: how many messages may run at once after
	// a quiet period. Defaults to 1.
	Burst int
}

// throttleSpareMin is the number of buckets a throttle keeps before it
// looks for full ones to forget.
const throttleSpareMin = 1024

// throttler holds the buckets of Config.Throttles.
type throttler struct {
	mu sync.Mutex
	ts []throttleState
}

type throttleState struct {
	Throttle
	limit   rate.Limit
	buckets map[string]*rate.Limiter
	sweepAt int
}

func validateThrottles(ts []Throttle) error {
	for i, t := range ts {
		switch {
		case t.By == nil:
			return fmt.Errorf("%w: subscribe.Config.Throttles[%d].By is nil", keyorder.ErrInvalidConfig, i)
		case !(t.Rate > 0) || math.IsInf(t.Rate, 0):
			return fmt.Errorf("%w: subscribe.Config.Throttles[%d].Rate must be positive and finite, got %v", keyorder.ErrInvalidConfig, i, t.Rate)
		case t.Burst < 0:
			return fmt.Errorf("%w: subscribe.Config.Throttles[%d].Burst must not be negative, got %d", keyorder.ErrInvalidConfig, i, t.Burst)
		}
	}
	return nil
}

func newThrottler(ts []Throttle) *throttler {
	if len(ts) == 0 {
		return nil
	}
	th := &throttler{ts: make([]throttleState, len(ts))}
	for i, t := range ts {
		t.Burst = max(t.Burst, 1)
		th.ts[i] = throttleState{Throttle: t, limit: rate.Limit(t.Rate), buckets: map[string]*rate.Limiter{}, sweepAt: throttleSpareMin}
	}
	return th
}

// take draws n tokens (at most a bucket's Burst) from every bucket m draws
// from and returns 0, or, when one of them holds too few, draws none and
// returns how long until all hold enough.
func (th *throttler) take(m *keyorder.Message, n int, now time.Time) time.Duration {
	var lims [4]*rate.Limiter
	use := lims[:0]
	th.mu.Lock()
	defer th.mu.Unlock()
	var wait time.Duration
	for i := range th.ts {
		t := &th.ts[i]
		b := t.By(m)
		if b == "" {
			continue
		}
		lim := t.buckets[b]
		if lim == nil {
			t.sweep(now)
			lim = rate.NewLimiter(t.limit, t.Burst)
			lim.SetBurstAt(now, t.Burst) // full at now, on any clock
			t.buckets[b] = lim
		}
		need := float64(min(n, t.Burst))
		if tok := lim.TokensAt(now); tok < need {
			d := time.Duration(math.Ceil((need - tok) / t.Rate * float64(time.Second)))
			wait = max(wait, d, time.Nanosecond)
		}
		use = append(use, lim)
	}
	if wait > 0 {
		return wait
	}
	for _, lim := range use {
		lim.AllowN(now, min(n, lim.Burst()))
	}
	return 0
}

// sweep forgets full buckets once there are many: a full bucket is the
// same as a new one, so memory follows the keys that are busy.
func (t *throttleState) sweep(now time.Time) {
	if len(t.buckets) < t.sweepAt {
		return
	}
	for b, lim := range t.buckets {
		if lim.TokensAt(now) >= float64(t.Burst) {
			delete(t.buckets, b)
		}
	}
	t.sweepAt = max(throttleSpareMin, 2*len(t.buckets))
}

// throttle returns a lanes.Result that makes the run of n messages headed
// by it (one under Run, a batch under RunBatch) wait for its buckets, or
// false when it may run now (its tokens taken): a run draws n tokens (at
// most each bucket's Burst) from the buckets of its first message.
func (s *Subscriber) throttle(it *item, n int) (lanes.Result, bool) {
	if s.throttles == nil {
		return lanes.Result{}, false
	}
	v := view(it.m)
	now := time.Now()
	wait := s.throttles.take(&v, n, now)
	if wait == 0 {
		return lanes.Result{}, false
	}
	// Wait at the head of its key (held under Exclusive too: the message
	// has not failed, so nothing of its key may overtake it), its
	// flow-control token given back; not an attempt, and never handed back
	// to a broker that holds groups natively.
	s.stats.Throttled.Add(1)
	s.park(it)
	return lanes.WaitAt(now.Add(wait)), true
}
