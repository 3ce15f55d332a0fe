package publish_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
)

var (
	combineSeeds = flag.Int("combine.seeds", 6, "TestCombinedSendsProperty: how many seeds to run (1..n)")
	combineSeed  = flag.Uint64("combine.seed", 0, "TestCombinedSendsProperty: run only this seed")
)

var (
	errFakePermanent = errors.New("fake broker: permanent failure")
	errFakeTransient = errors.New("fake broker: transient failure")
)

// fakeTopic is a broker that records what it accepted, per key, and
// checks the driver contract on every call: at most one call in flight per
// key, each call within the limits, and keys mixed in a call only when it
// declares driver.MixedKeySender. It fails calls at random, all-or-nothing.
type fakeTopic struct {
	mixed    bool
	limits   driver.Limits
	maxBatch int // Config.MaxBatch as the publisher applies it
	failPer  int // failures per 1000 calls; half of them transient

	mu        sync.Mutex
	rng       *rand.Rand
	inflight  map[string]bool
	delivered map[string][]int // key -> seqs accepted, in order
	calls     int
	combined  int // calls with more than one key
	failed    int
	problems  []string
}

func (f *fakeTopic) SendsMixedKeys() bool { return f.mixed }

func (f *fakeTopic) problem(format string, args ...any) {
	if len(f.problems) < 20 {
		f.problems = append(f.problems, fmt.Sprintf(format, args...))
	}
}

func (f *fakeTopic) SendBatch(ctx context.Context, ms []*driver.Message) error {
	f.mu.Lock()
	f.calls++
	call := f.calls
	if len(ms) == 0 {
		f.problem("empty call")
	}
	if len(ms) > f.maxBatch {
		f.problem("call of %d messages, MaxBatch %d", len(ms), f.maxBatch)
	}
	if lim := f.limits.MaxBatchBytes; lim > 0 && len(ms) > 1 {
		total := 0
		for _, m := range ms {
			total += len(m.Payload)
		}
		if total > lim {
			f.problem("call of %d payload bytes over %d messages, limit %d", total, len(ms), lim)
		}
	}
	var keys []string
	keyless := 0
	for _, m := range ms {
		if m.Key == "" {
			keyless++
		} else if !slices.Contains(keys, m.Key) {
			keys = append(keys, m.Key)
		}
	}
	switch {
	case keyless > 0 && keyless < len(ms):
		f.problem("call mixes keyless and keyed messages")
	case len(keys) > 1 && !f.mixed:
		f.problem("call mixes keys %v on a driver that does not combine", keys)
	case len(keys) > 1:
		f.combined++
	}
	for _, k := range keys {
		if f.inflight[k] {
			f.problem("two calls of key %s in flight", k)
		}
		f.inflight[k] = true
	}
	r, pause := f.rng.IntN(1000), time.Duration(f.rng.IntN(800)-600)*time.Microsecond
	f.mu.Unlock()

	// Let other publishers run while the call is "on the wire".
	if pause > 0 {
		time.Sleep(pause)
	} else {
		runtime.Gosched()
	}

	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range keys {
		delete(f.inflight, k)
	}
	switch {
	case r < f.failPer/2 || call == 3: // the third call always fails

		f.failed++
		return errFakePermanent
	case r < f.failPer:
		f.failed++
		return fmt.Errorf("try again: %w", errFakeTransient)
	}
	for _, m := range ms {
		if m.Key == "" {
			continue
		}
		key, seq := parseID(m.ID)
		if key != m.Key {
			f.problem("message %s sent with key %q", m.ID, m.Key)
		}
		f.delivered[key] = append(f.delivered[key], seq)
	}
	return nil
}

func (f *fakeTopic) Limits() driver.Limits              { return f.limits }
func (f *fakeTopic) IsRetryable(err error) bool         { return errors.Is(err, errFakeTransient) }
func (f *fakeTopic) ErrorCode(error) keyorder.ErrorCode { return keyorder.CodeUnavailable }
func (f *fakeTopic) Close() error                       { return nil }

// parseID splits a test message ID "key/seq".
func parseID(id string) (string, int) {
	i := strings.LastIndexByte(id, '/')
	seq, _ := strconv.Atoi(id[i+1:])
	return id[:i], seq
}

// sent is one published message as its publisher saw it.
type sent struct {
	key    string
	seq    int
	round  int
	queued bool // false: refused before it was queued (nothing sent)
	ok     bool // the publish reported success
	known  bool // ok is this message's own outcome (not a PublishBatch's)
	batch  int  // PublishBatch number, -1 for Publish and PublishAsync
}

// TestCombinedSendsProperty runs random publishers against a fake broker
// that fails calls at random: concurrent owners, each of its own keys,
// publish with PublishBatch (random shapes, keyless messages mixed in),
// Publish and PublishAsync, in rounds; at the end of each round an owner
// waits for its results and resumes its paused keys. It checks, per key:
// the broker got the messages in publish order, at most one call in
// flight; within a round (between resumes) the messages accepted form a
// prefix of those queued (after a failure nothing of the key is sent until
// it is resumed); each outcome reported matches what the broker got. On a
// driver that combines keys, calls did combine; on one that does not, none
// mixed keys. Run with -race; -combine.seeds=N runs more seeds.
func TestCombinedSendsProperty(t *testing.T) {
	seeds := make([]uint64, 0, *combineSeeds)
	if *combineSeed != 0 {
		seeds = append(seeds, *combineSeed)
	} else {
		for s := range *combineSeeds {
			seeds = append(seeds, uint64(s+1))
		}
	}
	var combined, combinable atomic.Int64
	t.Run("runs", func(t *testing.T) {
		for _, mixed := range []bool{true, false} {
			for _, seed := range seeds {
				t.Run(fmt.Sprintf("mixed=%v/seed=%d", mixed, seed), func(t *testing.T) {
					t.Parallel()
					n, ok := runCombineProperty(t, seed, mixed)
					if ok {
						combinable.Add(1)
						combined.Add(int64(n))
					}
				})
			}
		}
	})
	// A run may combine nothing by chance (a call that holds two messages
	// filled by one key each time), not all of them.
	if combinable.Load() > 0 && combined.Load() == 0 {
		t.Errorf("no call combined keys in %d runs where calls could", combinable.Load())
	}
}

// runCombineProperty runs one seed and returns the calls that combined
// keys, and whether calls could (keys combine on the driver, a call holds
// more than one message, no linger).
func runCombineProperty(t *testing.T, seed uint64, mixed bool) (int, bool) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	pick := func(xs ...int) int { return xs[rng.IntN(len(xs))] }
	cfg := &publish.Config{
		MissingKey:             policy.Unordered,
		MaxBatch:               pick(1, 2, 3, 5, 8, 40),
		SendRetries:            pick(-1, 1, 2),
		Backoff:                policy.Retry{MinBackoff: time.Microsecond, MaxBackoff: 10 * time.Microsecond},
		MaxOutstandingMessages: pick(-1, 4, 25, 200),
		Linger:                 time.Duration(pick(0, 0, 50)) * time.Microsecond,
		Logger:                 slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	ft := &fakeTopic{
		mixed:     mixed,
		limits:    driver.Limits{Backend: "fake", MaxBatchMessages: pick(0, 4, 1000), MaxBatchBytes: pick(0, 30, 200)},
		failPer:   pick(20, 60, 150),
		rng:       rand.New(rand.NewPCG(seed, 0xb10c)),
		inflight:  map[string]bool{},
		delivered: map[string][]int{},
	}
	ft.maxBatch = cfg.MaxBatch
	if m := ft.limits.MaxBatchMessages; m > 0 && m < ft.maxBatch {
		ft.maxBatch = m
	}
	p, err := publish.New(ft, cfg)
	if err != nil {
		t.Fatal(err)
	}
	owners, keysPer, rounds, opsPer := 2+rng.IntN(4), 2+rng.IntN(7), 8, 16
	t.Logf("seed %d: MaxBatch %d, retries %d, outstanding %d, linger %v, limits %+v, fail/1000 %d, owners %d × %d keys",
		seed, cfg.MaxBatch, cfg.SendRetries, cfg.MaxOutstandingMessages, cfg.Linger, ft.limits, ft.failPer, owners, keysPer)

	ctx := context.Background()
	logs := make([][]*sent, owners)
	keylessIn := make([]map[int]bool, owners) // per owner, the PublishBatch numbers with keyless messages
	var wg sync.WaitGroup
	for o := range owners {
		orng := rand.New(rand.NewPCG(seed, uint64(o)))
		keys := make([]string, keysPer)
		for i := range keys {
			keys[i] = fmt.Sprintf("o%dk%d", o, i)
		}
		next := map[string]int{}
		keyless := map[int]bool{}
		keylessIn[o] = keyless
		newMsg := func(round, batch int) (*keyorder.Message, *sent) {
			if batch >= 0 && orng.IntN(10) == 0 {
				// Keyless, in a PublishBatch: sent apart, never combined.
				keyless[batch] = true
				return &keyorder.Message{Payload: []byte("keyless")}, nil
			}
			k := keys[orng.IntN(len(keys))]
			s := &sent{key: k, seq: next[k], round: round, batch: batch}
			next[k]++
			m := &keyorder.Message{ID: fmt.Sprintf("%s/%d", k, s.seq), Key: k, Payload: make([]byte, orng.IntN(25))}
			return m, s
		}
		wg.Go(func() {
			var log []*sent
			batches := 0
			for round := range rounds {
				type async struct {
					r *publish.Result
					s *sent
				}
				var pending []async
				for range opsPer {
					switch orng.IntN(3) {
					case 0: // PublishBatch of a random shape
						n := 1 + orng.IntN(3*keysPer+2)
						ms := make([]*keyorder.Message, 0, n)
						var ss []*sent
						for range n {
							m, s := newMsg(round, batches)
							ms = append(ms, m)
							if s != nil {
								ss = append(ss, s)
							}
						}
						batches++
						ids, err := p.PublishBatch(ctx, ms)
						for _, s := range ss {
							s.queued, s.ok = ids != nil, err == nil
							log = append(log, s)
						}
					case 1: // Publish
						m, s := newMsg(round, -1)
						id, err := p.Publish(ctx, m)
						s.queued, s.ok, s.known = id != "", err == nil, true
						log = append(log, s)
					case 2: // a run of PublishAsync, results read at the round's end
						for range 1 + orng.IntN(2*keysPer) {
							m, s := newMsg(round, -1)
							pending = append(pending, async{p.PublishAsync(ctx, m), s})
							log = append(log, s)
						}
					}
				}
				for _, a := range pending {
					id, err := a.r.Get(ctx)
					a.s.queued, a.s.ok, a.s.known = id != "", err == nil, true
				}
				// Nothing of this owner is outstanding: resume its keys.
				for _, k := range keys {
					p.Resume(k)
				}
			}
			logs[o] = log
		})
	}
	wg.Wait()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}

	ft.mu.Lock()
	defer ft.mu.Unlock()
	for _, pr := range ft.problems {
		t.Error(pr)
	}
	byKey := map[string][]*sent{}
	for _, log := range logs {
		for _, s := range log {
			byKey[s.key] = append(byKey[s.key], s)
		}
	}
	resumedAndSent := 0
	for key, ss := range byKey {
		got := ft.delivered[key]
		// Publish order, no duplicate.
		if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
			t.Errorf("key %s: broker got seqs %v, not in publish order", key, got)
			continue
		}
		in := map[int]bool{}
		for _, seq := range got {
			in[seq] = true
		}
		blocked := -1 // the round in which a queued message of the key failed
		for i, s := range ss {
			if s.seq != i {
				t.Fatalf("key %s: log out of order", key)
			}
			switch {
			case !s.queued && in[s.seq]:
				t.Errorf("key %s seq %d: refused, yet sent", key, s.seq)
			case s.known && s.ok != in[s.seq]:
				t.Errorf("key %s seq %d: publish reported ok=%v, broker has it: %v", key, s.seq, s.ok, in[s.seq])
			case s.ok && !in[s.seq]:
				t.Errorf("key %s seq %d: PublishBatch reported success, broker lacks it", key, s.seq)
			}
			if !s.queued {
				continue
			}
			// No gap: after a queued message of the key was not sent,
			// nothing queued later in the round (before the owner resumed
			// the key) is.
			switch {
			case !in[s.seq]:
				blocked = s.round
			case blocked == s.round:
				t.Errorf("key %s seq %d: sent after an earlier message of the key failed in round %d, before it was resumed", key, s.seq, s.round)
			case blocked >= 0:
				resumedAndSent++
				blocked = -1
			}
		}
	}
	// A PublishBatch that reported an error (and had no keyless message,
	// whose failure is not recorded) lost at least one message.
	for o, log := range logs {
		lost, failed := map[int]bool{}, map[int]bool{}
		for _, s := range log {
			if s.batch >= 0 && !s.ok && !keylessIn[o][s.batch] {
				failed[s.batch] = true
				if !slices.Contains(ft.delivered[s.key], s.seq) {
					lost[s.batch] = true
				}
			}
		}
		for b := range failed {
			if !lost[b] {
				t.Errorf("owner %d PublishBatch %d failed, yet the broker got all its keyed messages", o, b)
			}
		}
	}
	t.Logf("%d calls, %d combined, %d failed; %d keys sent again after a failure and resume", ft.calls, ft.combined, ft.failed, resumedAndSent)
	if ft.failed == 0 {
		t.Error("no call failed: the run tested no failure")
	}
	// A lingering key goes on its own timer, so with Linger keys combine
	// only while every call is busy.
	return ft.combined, mixed && ft.maxBatch > 1 && cfg.Linger == 0
}

// mixedSteps is a stepTopic that declares driver.MixedKeySender.
type mixedSteps struct{ *stepTopic }

func (mixedSteps) SendsMixedKeys() bool { return true }

// On a driver that combines keys: the keys of a PublishBatch go in one
// call, each key's messages together and in order; a key queued behind
// that call waits while a key with nothing in flight goes in a call of its
// own; the call's failure pauses every key in it and fails what queued
// behind them, and after the resume the keys are sent again, combined.
func TestCombinedSendFailurePausesEveryKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := memory.NewBroker()
		if err := b.CreateSubscription("t", "s", &memory.SubscriptionOptions{Ordering: policy.Parallel, MaxBatch: 1000}); err != nil {
			t.Fatal(err)
		}
		st := &stepTopic{Topic: memhook.Of(b).TopicDriver("t"), steps: make(chan step, 100)}
		p, err := publish.New(mixedSteps{st}, &publish.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close(context.Background())
		sub, err := memhook.Of(b).SubscriptionDriver("s")
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()

		batch := make(chan error, 1)
		go func() {
			_, err := p.PublishBatch(ctx, []*keyorder.Message{msg("a1", "A", "a1"), msg("b1", "B", "b1"), msg("a2", "A", "a2"), msg("c1", "C", "c1")})
			batch <- err
		}()
		first := st.next(t)
		if want := []string{"a1", "a2", "b1", "c1"}; !slices.Equal(first.payloads, want) {
			t.Fatalf("first call sent %v, want %v", first.payloads, want)
		}
		a3 := p.PublishAsync(ctx, msg("a3", "A", "a3"))
		d1 := p.PublishAsync(ctx, msg("d1", "D", "d1"))
		second := st.next(t)
		if want := []string{"d1"}; !slices.Equal(second.payloads, want) {
			t.Fatalf("second call sent %v, want %v (A is in flight)", second.payloads, want)
		}
		st.idle(t)

		boom := errors.New("boom")
		first.reply <- boom
		if err := <-batch; !errors.Is(err, boom) {
			t.Fatalf("PublishBatch = %v, want boom", err)
		}
		synctest.Wait()
		if _, err := a3.Get(ctx); !errors.Is(err, keyorder.ErrKeyPaused) {
			t.Fatalf("a3, queued behind the failed call = %v, want ErrKeyPaused", err)
		}
		if got := p.Paused(); !slices.Equal(got, []string{"A", "B", "C"}) {
			t.Fatalf("paused %v, want [A B C]", got)
		}
		if _, err := p.PublishAsync(ctx, msg("b2", "B", "b2")).Get(ctx); !errors.Is(err, keyorder.ErrKeyPaused) {
			t.Fatalf("b2 after the failure = %v, want ErrKeyPaused", err)
		}
		second.reply <- nil
		if _, err := d1.Get(ctx); err != nil {
			t.Fatalf("d1 = %v", err)
		}
		st.idle(t)

		if n := p.ResumeAll(); n != 3 {
			t.Fatalf("ResumeAll = %d, want 3", n)
		}
		go func() {
			_, err := p.PublishBatch(ctx, []*keyorder.Message{msg("b3", "B", "b3"), msg("a4", "A", "a4")})
			batch <- err
		}()
		third := st.next(t)
		if want := []string{"b3", "a4"}; !slices.Equal(third.payloads, want) {
			t.Fatalf("after the resume the call sent %v, want %v", third.payloads, want)
		}
		third.reply <- nil
		if err := <-batch; err != nil {
			t.Fatal(err)
		}
		if got := payloads(receiveAll(t, sub)); !slices.Equal(got, []string{"d1", "b3", "a4"}) {
			t.Fatalf("the broker got %v, want [d1 b3 a4]", got)
		}
	})
}
