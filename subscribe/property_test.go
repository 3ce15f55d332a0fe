package subscribe_test

// This file: a randomized property test of the whole consuming side on the
// memory broker, under virtual time: both hold shapes (the broker holds a
// failed key, or the process does; with native hold, chains held in process
// on failure or not: Capabilities.HoldChains), Ordered and Exclusive, Run and RunBatch,
// lane keys (including broker keys that look like refined ones), fairness
// keys, throttles, not-before times, lost leases and graceful restarts, each
// drawn at random per scenario. Every scenario checks the promise:
//
//   - no two runs of one lane group overlap (Exclusive, Ordered);
//   - a lane group's messages first start in publish order (Ordered; and
//     Exclusive, bar messages with a not-before time or a lost lease);
//   - no message of a lane group starts while one published before it is
//     unresolved (Ordered);
//   - every message is resolved: acknowledged, or dead-lettered by its own
//     Permanent error or by an attempt budget its runs and lost leases used
//     up;
//   - attempts count runs only: a message's k-th run is attempt k unless a
//     lease of it was lost (then at most k plus its lost leases), and a
//     message that lost none is dead-lettered only for its own Permanent.
//
// KEYORDER_PROP_SEEDS sets how many scenarios run (default 300);
// KEYORDER_PROP_SEED runs that one seed alone, for a failure's replay.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/lanes"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// propScenario is one randomly drawn configuration and workload.
type propScenario struct {
	seed  uint64
	hold  memory.Hold
	chain int
	// holdChains: the driver declares Capabilities.HoldChains (Native
	// only), so a failed chain member with members behind it is retried in
	// process.
	holdChains bool
	// assign is the subscriber's lane assignment: ByKey (a key hashed onto
	// one lane and worker) or Shared (one lane every worker serves).
	assign   lanes.Assignment
	ordering policy.Ordering
	batch    *subscribe.BatchConfig // nil: Run
	laneKey  bool
	fair     bool
	throttle bool
	stalls   bool
	restart  bool
	workers  int
	maxOut   int
	msgs     []*propMsg
}

// propMsg is one message of a scenario and its fate as planned.
type propMsg struct {
	id, key, sub, tenant string
	delay                time.Duration // not-before, from its publish
	fails                int           // handler runs that fail before it succeeds
	retryAfter           bool          // its failures ask for a delay
	permanent            bool          // its first run fails permanently
	at                   time.Duration // when it is published, from the start
	idx                  int           // publish order
}

func (sc *propScenario) String() string {
	hold := "native"
	if sc.hold == memory.InProcess {
		hold = "in-process"
	}
	mode := "Run"
	if sc.batch != nil {
		mode = fmt.Sprintf("RunBatch(%d,%v)", sc.batch.MaxSize, sc.batch.MaxWait)
	}
	if sc.holdChains {
		hold += "+chains"
	}
	return fmt.Sprintf("seed=%d hold=%s chain=%d %v %v %s laneKey=%v fair=%v throttle=%v stalls=%v restart=%v workers=%d maxOutstanding=%d msgs=%d",
		sc.seed, hold, sc.chain, sc.assign, sc.ordering, mode, sc.laneKey, sc.fair, sc.throttle, sc.stalls, sc.restart, sc.workers, sc.maxOut, len(sc.msgs))
}

func drawScenario(seed uint64) *propScenario {
	r := rand.New(rand.NewPCG(seed, 0x6b65796f72646572))
	sc := &propScenario{seed: seed, chain: 1, workers: 1 + r.IntN(4)}
	if r.IntN(2) == 0 {
		sc.hold = memory.InProcess
	} else {
		sc.chain = 1 + r.IntN(4)
	}
	sc.ordering = policy.Ordered
	if r.IntN(3) == 0 {
		sc.ordering = policy.Exclusive
	}
	// Drawn from a stream of its own, so every other draw of a seed stays
	// what it was before this dimension existed.
	sc.holdChains = sc.hold == memory.Native && rand.New(rand.NewPCG(seed, 0x686f6c64)).IntN(2) == 0
	sc.assign = lanes.ByKey
	if rand.New(rand.NewPCG(seed, 0x61737369676e)).IntN(2) == 0 {
		sc.assign = lanes.Shared
	}
	if r.IntN(2) == 0 {
		sc.batch = &subscribe.BatchConfig{MaxSize: 1 + r.IntN(4), MaxWait: time.Duration(1+r.IntN(50)) * time.Millisecond}
	}
	sc.laneKey = r.IntN(2) == 0
	sc.fair = r.IntN(3) == 0
	sc.throttle = r.IntN(4) == 0
	sc.stalls = r.IntN(2) == 0
	sc.restart = r.IntN(3) == 0
	if r.IntN(2) == 0 {
		sc.maxOut = 1 + r.IntN(8)
		if sc.batch != nil {
			sc.maxOut = max(sc.maxOut, sc.batch.MaxSize)
		}
	}
	// Broker keys: "a/b" next to "a" refined by "b" is the pair a lane key
	// must never merge.
	keys := []string{"a", "a/b", "c", "d%2F", "e"}[:2+r.IntN(4)]
	n := 12 + r.IntN(30)
	at := time.Duration(0)
	for i := range n {
		m := &propMsg{id: fmt.Sprintf("m%03d", i), idx: i}
		if r.IntN(10) > 0 {
			m.key = keys[r.IntN(len(keys))]
			if sc.laneKey {
				m.sub = []string{"", "b", "x"}[r.IntN(3)]
			}
		}
		m.tenant = []string{"t1", "t2"}[r.IntN(2)]
		switch f := r.IntN(20); {
		case f == 0:
			m.permanent = true
		case f < 5:
			m.fails = 1
		case f < 7:
			m.fails = 2
		}
		m.retryAfter = r.IntN(2) == 0
		if r.IntN(15) == 0 {
			m.delay = time.Duration(1+r.IntN(20)) * time.Second
		}
		if r.IntN(4) == 0 {
			at += time.Duration(r.IntN(5000)) * time.Millisecond
		}
		m.at = at
		sc.msgs = append(sc.msgs, m)
	}
	return sc
}

// group is the message's lane group as the test defines it: the broker key,
// refined by the message's sub part when lane keys are on. "" for keyless.
func (m *propMsg) group() string {
	if m.key == "" {
		return ""
	}
	if m.sub == "" {
		return "broker:" + m.key
	}
	return "lane:" + m.key + "|" + m.sub
}

// propRun is one run of a message by the handler.
type propRun struct {
	id         string
	attempt    int
	start, end uint64
	outcome    string // "ack", "fail", "permanent", "cancelled"
	lostBefore int    // leases of the message lost before the run started
}

// propLog records runs and lost leases, stamped with one sequence.
type propLog struct {
	mu   sync.Mutex
	seq  uint64
	runs []*propRun
	lost map[string]int
	held map[string]int  // copies received and not settled
	dead map[string]bool // dead-lettered by a DeadLetter call that landed
	// unreported counts losses proven by a redelivery and not yet
	// reported by a renewal.
	unreported map[string]int
	acked      map[string]bool
	restarted  bool
}

func (l *propLog) begin(d *keyorder.Delivery) *propRun {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	r := &propRun{id: d.ID, attempt: d.Attempt, start: l.seq, lostBefore: l.lost[d.ID]}
	l.runs = append(l.runs, r)
	return r
}

func (l *propLog) finish(r *propRun, outcome string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	r.end, r.outcome = l.seq, outcome
	if outcome == "ack" {
		l.acked[r.id] = true
	}
}

// propDriver wraps the memory driver: it counts the leases the broker
// took back (reported lost by a renewal, or proven lost by a redelivery of a
// message still held) and can stall lease renewals so that leases run out.
type propDriver struct {
	driver.Subscription
	log        *propLog
	holdChains bool // declare Capabilities.HoldChains
	mu         sync.Mutex
	until      time.Time
}

func (d *propDriver) Capabilities() driver.Capabilities {
	c := d.Subscription.Capabilities()
	c.HoldChains = d.holdChains
	return c
}

func (d *propDriver) stall(dur time.Duration) {
	d.mu.Lock()
	d.until = time.Now().Add(dur)
	d.mu.Unlock()
}

func (d *propDriver) Receive(ctx context.Context, n int) ([]*driver.Message, error) {
	ms, err := d.Subscription.Receive(ctx, n)
	l := d.log
	l.mu.Lock()
	for _, m := range ms {
		if l.acked[m.ID] || l.dead[m.ID] {
			// A redelivery of a message acknowledged or dead-lettered
			// already (a
			// streaming broker redelivers a key's later messages with an
			// earlier one whose lease ran out): its count may rise like
			// a lost lease's.
			l.lost[m.ID]++
		}
		if l.held[m.ID] > 0 {
			// Redelivered while this process holds it: the lease of
			// the copy it holds is gone, reported or not.
			l.lost[m.ID]++
			l.unreported[m.ID]++
		}
		l.held[m.ID]++
	}
	l.mu.Unlock()
	return ms, err
}

// settled records a settlement call on ms. A call that failed found a
// lease gone (the memory broker's only failure here): the broker took the
// message back, as with a lost lease, and the attempt it ran may go
// uncounted (it counts only the chain's first unsettled message).
func (d *propDriver) settled(err error, ms ...*driver.Message) {
	d.log.mu.Lock()
	for _, m := range ms {
		d.log.held[m.ID] = max(d.log.held[m.ID]-1, 0)
		if err != nil {
			d.log.lost[m.ID]++
		}
	}
	d.log.mu.Unlock()
}

func (d *propDriver) Ack(ctx context.Context, ms []*driver.Message) error {
	err := d.Subscription.Ack(ctx, ms)
	d.settled(err, ms...)
	return err
}

func (d *propDriver) Nack(ctx context.Context, m *driver.Message, delay time.Duration) error {
	err := d.Subscription.Nack(ctx, m, delay)
	d.settled(err, m)
	return err
}

func (d *propDriver) Release(ctx context.Context, ms []*driver.Message) error {
	err := d.Subscription.Release(ctx, ms)
	d.settled(err, ms...)
	return err
}

func (d *propDriver) DeadLetter(ctx context.Context, m *driver.Message, reason string, attempts int) error {
	err := d.Subscription.DeadLetter(ctx, m, reason, attempts)
	d.settled(err, m)
	if err == nil {
		d.log.mu.Lock()
		d.log.dead[m.ID] = true
		d.log.mu.Unlock()
	}
	return err
}

func (d *propDriver) ExtendLeases(ctx context.Context, ms []*driver.Message) ([]*driver.Message, error) {
	d.mu.Lock()
	stalled := time.Now().Before(d.until)
	d.mu.Unlock()
	if stalled {
		return nil, nil
	}
	lost, err := d.Subscription.ExtendLeases(ctx, ms)
	l := d.log
	l.mu.Lock()
	for _, m := range lost {
		l.held[m.ID] = max(l.held[m.ID]-1, 0)
		if l.unreported[m.ID] > 0 {
			l.unreported[m.ID]--
		} else {
			l.lost[m.ID]++
		}
	}
	l.mu.Unlock()
	return lost, err
}

func TestPropertyPromiseUnderRandomScenarios(t *testing.T) {
	seeds := []uint64{}
	if s := os.Getenv("KEYORDER_PROP_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("KEYORDER_PROP_SEED: %v", err)
		}
		seeds = append(seeds, v)
	} else {
		n := 300
		if s := os.Getenv("KEYORDER_PROP_SEEDS"); s != "" {
			v, err := strconv.Atoi(s)
			if err != nil {
				t.Fatalf("KEYORDER_PROP_SEEDS: %v", err)
			}
			n = v
		}
		for i := range n {
			seeds = append(seeds, uint64(i+1))
		}
	}
	for _, seed := range seeds {
		sc := drawScenario(seed)
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { runScenario(t, sc) })
		})
	}
}

const (
	propMaxAttempts = 4
	propLease       = 10 * time.Second
)

func runScenario(t *testing.T, sc *propScenario) {
	b := memory.NewBroker()
	if err := b.CreateSubscription("t", "s", &memory.SubscriptionOptions{
		Ordering: sc.ordering, Hold: sc.hold, Chain: sc.chain, Lease: propLease,
	}); err != nil {
		t.Fatal(err)
	}
	pub, err := publish.New(memhook.Of(b).TopicDriver("t"), &publish.Config{Logger: quiet, MissingKey: policy.Unordered})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(context.Background())

	byID := map[string]*propMsg{}
	for _, m := range sc.msgs {
		byID[m.id] = m
	}
	log := &propLog{lost: map[string]int{}, held: map[string]int{}, dead: map[string]bool{}, unreported: map[string]int{}, acked: map[string]bool{}}
	var failsLeft sync.Map // id -> *int, guarded by log.mu
	for _, m := range sc.msgs {
		n := m.fails
		failsLeft.Store(m.id, &n)
	}
	r := rand.New(rand.NewPCG(sc.seed, 7))
	var rmu sync.Mutex
	work := func() time.Duration {
		rmu.Lock()
		defer rmu.Unlock()
		if r.IntN(3) == 0 {
			return time.Duration(r.IntN(3000)) * time.Millisecond
		}
		return 0
	}

	// runOne is one run of one message: what either handler shape does
	// for a member.
	runOne := func(ctx context.Context, d *keyorder.Delivery) error {
		m := byID[d.ID]
		run := log.begin(d)
		if w := work(); w > 0 {
			select {
			case <-ctx.Done():
				log.finish(run, "cancelled")
				return ctx.Err()
			case <-time.After(w):
			}
		}
		if m.permanent {
			log.finish(run, "permanent")
			return keyorder.Permanent(errors.New("poison"))
		}
		p, _ := failsLeft.Load(d.ID)
		log.mu.Lock()
		left := p.(*int)
		fail := *left > 0
		if fail {
			*left--
		}
		log.mu.Unlock()
		if fail {
			log.finish(run, "fail")
			if m.retryAfter {
				return keyorder.RetryAfter(errors.New("not yet"), 3*time.Second)
			}
			return errors.New("transient")
		}
		if ctx.Err() != nil {
			// Done, but the lease was lost meanwhile: the broker
			// redelivers it, so it is not settled.
			log.finish(run, "cancelled")
			return ctx.Err()
		}
		log.finish(run, "ack")
		return nil
	}

	cfg := func() *subscribe.Config {
		c := &subscribe.Config{
			Workers: sc.workers, Assign: sc.assign, MaxOutstanding: sc.maxOut, Logger: quiet, Batch: sc.batch,
			Retry: policy.Retry{MaxAttempts: propMaxAttempts, MinBackoff: time.Second, MaxBackoff: 5 * time.Second},
		}
		if sc.laneKey {
			c.LaneKey = keyorder.KeyFromHeaders("sub")
		}
		if sc.fair {
			c.FairnessKey = subscribe.FairnessKeyHeader
		}
		if sc.throttle {
			c.Throttles = []subscribe.Throttle{{By: subscribe.OrderingKey, Rate: 2, Burst: 2}}
		}
		return c
	}
	var drv *propDriver
	start := func() (*subscribe.Subscriber, chan error) {
		raw, err := memhook.Of(b).SubscriptionDriver("s")
		if err != nil {
			t.Fatal(err)
		}
		drv = &propDriver{Subscription: raw, log: log, holdChains: sc.holdChains}
		s, err := subscribe.New(drv, cfg())
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		if sc.batch == nil {
			go func() { done <- s.Run(context.Background(), runOne) }()
		} else {
			go func() {
				done <- s.RunBatch(context.Background(), func(ctx context.Context, ds []*keyorder.Delivery) error {
					for i, d := range ds {
						if err := runOne(ctx, d); err != nil {
							return keyorder.FailedAt(i, err)
						}
					}
					return nil
				})
			}()
		}
		synctest.Wait() // Run has begun: a Close from now on stops it
		return s, done
	}
	stop := func(s *subscribe.Subscriber, done chan error) {
		if err := s.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}

	s, done := start()
	// Publish on schedule, and meanwhile stall leases and restart.
	t0 := time.Now()
	// Events: a graceful restart at a random time, and one to three lease
	// stalls, each starting as a message is published (so that something
	// is outstanding) and lasting two lease durations.
	type event struct {
		at      time.Duration
		restart bool
	}
	var events []event
	last := sc.msgs[len(sc.msgs)-1].at
	if sc.restart {
		events = append(events, event{at: time.Duration(r.Int64N(int64(last + 10*time.Second))), restart: true})
	}
	if sc.stalls {
		for range 1 + r.IntN(3) {
			events = append(events, event{at: sc.msgs[r.IntN(len(sc.msgs))].at})
		}
	}
	slices.SortStableFunc(events, func(a, b event) int { return int(a.at - b.at) })
	fire := func(until time.Duration) {
		for len(events) > 0 && events[0].at <= until {
			e := events[0]
			events = events[1:]
			time.Sleep(time.Until(t0.Add(e.at)))
			if !e.restart {
				drv.stall(2 * propLease)
				continue
			}
			stop(s, done)
			log.mu.Lock()
			log.restarted = true
			log.mu.Unlock()
			s, done = start()
		}
	}
	for _, m := range sc.msgs {
		fire(m.at)
		time.Sleep(time.Until(t0.Add(m.at)))
		msg := &keyorder.Message{ID: m.id, Key: m.key, Payload: []byte(m.id), Headers: map[string]string{keyorder.HeaderFairnessKey: m.tenant}}
		if m.sub != "" {
			msg.Headers["sub"] = m.sub
		}
		if m.delay > 0 {
			msg.NotBefore = time.Now().Add(m.delay)
		}
		if _, err := pub.Publish(context.Background(), msg); err != nil {
			t.Fatalf("publish %s: %v", m.id, err)
		}
	}
	fire(time.Duration(math.MaxInt64))
	// Wait until every message is resolved, up to two hours of virtual
	// time.
	dead := func() map[string]driver.DeadLetter {
		dls, err := drv.Subscription.(driver.DeadLetterStore).DeadLetters(context.Background(), 0)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]driver.DeadLetter{}
		for _, dl := range dls {
			out[dl.Message.ID] = dl
		}
		return out
	}
	resolved := func() bool {
		dl := dead()
		log.mu.Lock()
		defer log.mu.Unlock()
		for _, m := range sc.msgs {
			if _, ok := dl[m.id]; !ok && !log.acked[m.id] {
				return false
			}
		}
		return true
	}
	for i := 0; i < 120 && !resolved(); i++ {
		time.Sleep(time.Minute)
		synctest.Wait()
	}
	stop(s, done)
	lost := 0
	for _, n := range log.lost {
		lost += n
	}
	t.Logf("%s: %d runs, %d dead letters, %d leases lost", sc, len(log.runs), len(dead()), lost)
	checkScenario(t, sc, log, dead())
}

func checkScenario(t *testing.T, sc *propScenario, log *propLog, dead map[string]driver.DeadLetter) {
	t.Helper()
	log.mu.Lock()
	defer log.mu.Unlock()
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	byID := map[string]*propMsg{}
	runsOf := map[string][]*propRun{}
	for _, m := range sc.msgs {
		byID[m.id] = m
	}
	for _, r := range log.runs {
		runsOf[r.id] = append(runsOf[r.id], r)
		if r.end == 0 {
			bad("%s: a run (attempt %d) never ended", r.id, r.attempt)
		}
	}

	// Resolution, dead letters and attempts.
	for _, m := range sc.msgs {
		runs := runsOf[m.id]
		dl, isDead := dead[m.id]
		if !isDead && !log.acked[m.id] {
			bad("%s (key %q): neither acknowledged nor dead-lettered after %d runs", m.id, m.key, len(runs))
		}
		if isDead && log.acked[m.id] {
			bad("%s: acknowledged and dead-lettered", m.id)
		}
		lost := log.lost[m.id]
		if isDead && !m.permanent {
			if lost == 0 {
				bad("%s: dead-lettered (%q, attempts %d) after %d runs without a lost lease or a Permanent error", m.id, dl.Reason, dl.Attempts, len(runs))
			} else if len(runs)+lost < propMaxAttempts {
				bad("%s: dead-lettered (%q) after %d runs and %d lost leases, under the budget %d", m.id, dl.Reason, len(runs), lost, propMaxAttempts)
			}
		}
		if m.permanent && !isDead {
			bad("%s: failed permanently but was not dead-lettered", m.id)
		}
		for k, r := range runs {
			want := k + 1
			switch {
			case r.attempt < 1:
				bad("%s: run %d has attempt %d", m.id, want, r.attempt)
			case r.lostBefore == 0 && sc.hold == memory.Native && !sc.holdChains && r.attempt != want:
				// Under HoldChains a retry run in process is no delivery:
				// after a restart the broker's count may be below the
				// runs (checked below, as for InProcess).
				bad("%s: run %d has attempt %d; with no lease of it lost, want %d", m.id, want, r.attempt, want)
			case r.lostBefore == 0 && r.attempt > want:
				bad("%s: run %d has attempt %d, more than its runs", m.id, want, r.attempt)
			case r.lostBefore == 0 && !log.restarted && r.attempt != want:
				bad("%s: run %d has attempt %d; with no lease of it lost and no restart, want %d", m.id, want, r.attempt, want)
			case r.attempt > want+r.lostBefore:
				bad("%s: run %d has attempt %d, more than its runs and %d lost leases", m.id, want, r.attempt, r.lostBefore)
			}
		}
	}

	// Per lane group: overlap, first-start order, head of line.
	groups := map[string][]*propMsg{}
	for _, m := range sc.msgs {
		if g := m.group(); g != "" {
			groups[g] = append(groups[g], m)
		}
	}
	for g, ms := range groups {
		var runs []*propRun
		for _, m := range ms {
			runs = append(runs, runsOf[m.id]...)
		}
		slices.SortFunc(runs, func(a, b *propRun) int { return int(a.start) - int(b.start) })
		for i := 1; i < len(runs); i++ {
			for _, p := range runs[:i] {
				if p.end > runs[i].start {
					bad("group %s: %s (attempt %d) started while %s (attempt %d) ran", g, runs[i].id, runs[i].attempt, p.id, p.attempt)
				}
			}
		}
		var prev *propMsg
		prevFirst := uint64(0)
		for _, m := range ms {
			rs := runsOf[m.id]
			if len(rs) == 0 {
				continue
			}
			if sc.ordering == policy.Exclusive && (m.delay > 0 || log.lost[m.id] > 0) {
				// Under Exclusive a message waiting on a time, or
				// taken back by the broker with its lost lease (a
				// failed attempt), may be overtaken.
				continue
			}
			if rs[0].start < prevFirst {
				bad("group %s: %s first started before %s, published before it", g, m.id, prev.id)
			}
			prev, prevFirst = m, rs[0].start
		}
		if sc.ordering != policy.Ordered {
			continue
		}
		// Head of line: a message is resolved by its first run that
		// acknowledged it or dead-lettered it (a redelivery of it after
		// that is a duplicate, which at-least-once allows, and may come
		// with the key's later messages, in order); until then nothing
		// published after it in its group may start.
		for i, m := range ms {
			for _, earlier := range ms[:i] {
				resolved, how := uint64(0), ""
				ers := runsOf[earlier.id]
				for _, er := range ers {
					if er.outcome == "ack" || er.outcome == "permanent" {
						resolved, how = er.end, fmt.Sprintf("its run of attempt %d", er.attempt)
						break
					}
				}
				if _, isDead := dead[earlier.id]; resolved == 0 && isDead && len(ers) > 0 {
					er := ers[len(ers)-1] // its budget ran out with its last run
					resolved, how = er.end, fmt.Sprintf("its last run, of attempt %d", er.attempt)
				}
				if resolved == 0 {
					continue // dead-lettered unrun: no run to order against
				}
				for _, r := range runsOf[m.id] {
					if r.start < resolved {
						bad("group %s: %s (attempt %d) started before %s, published before it, was resolved (by %s)", g, m.id, r.attempt, earlier.id, how)
					}
				}
			}
		}
	}
	if len(errs) > 0 {
		slices.Sort(errs)
		errs = slices.Compact(errs)
		if len(errs) > 15 {
			errs = append(errs[:15], fmt.Sprintf("... and %d more", len(errs)-15))
		}
		var tl strings.Builder
		for _, r := range log.runs {
			m := byID[r.id]
			fmt.Fprintf(&tl, "  [%d-%d] %s group=%s attempt=%d %s lost=%d\n", r.start, r.end, r.id, m.group(), r.attempt, r.outcome, r.lostBefore)
		}
		t.Fatalf("%s\n%s\nruns:\n%s", sc, strings.Join(errs, "\n"), tl.String())
	}
}
