package postgres_test

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/integration/proctest"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// The failure tests run consumers as real processes (proctest's helpers):
// the test binary re-executed as helper "consumer" or "stack" runs
// helperConsumer or helperStack instead of the tests, so a SIGKILL hits a
// process holding leases, as a crash would.

func TestMain(m *testing.M) {
	proctest.Main(openCrashConsumer)
	proctest.Helpers(map[string]func() int{"consumer": helperConsumer, "stack": helperStack, "ledger": helperLedger})
	os.Exit(m.Run())
}

// helperConsumer consumes a subscription until killed. For each message it
// appends "start key id attempt unixnano" and "end key id attempt unixnano
// ok|fail" lines to its records (proctest.Records). It fails a message (Nack) with probability
// KEYORDER_PG_FAIL and blocks forever in the handler of message
// KEYORDER_PG_HANG.
func helperConsumer() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("KEYORDER_PG_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	lease, _ := time.ParseDuration(os.Getenv("KEYORDER_PG_LEASE"))
	s, err := postgres.OpenSubscriptionDriver(ctx, pool, os.Getenv("KEYORDER_PG_TOPIC"), "s", &postgres.Options{
		Schema: os.Getenv("KEYORDER_PG_SCHEMA"), Lease: lease, PollInterval: 50 * time.Millisecond,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	write, err := proctest.Records()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	failP, _ := strconv.ParseFloat(os.Getenv("KEYORDER_PG_FAIL"), 64)
	hang := os.Getenv("KEYORDER_PG_HANG")
	for {
		ms, err := s.Receive(ctx, 20)
		if err != nil {
			time.Sleep(10 * time.Millisecond) // transient: the test restarts nothing here
			continue
		}
		// Each run of one key is a chain: run it in order; when one fails,
		// give the rest of its chain back unrun.
		for i := 0; i < len(ms); {
			j := i
			for j < len(ms) && ms[j].Key == ms[i].Key {
				j++
			}
			for n, m := range ms[i:j] {
				// As subscribe does, record the start (and, for the tests'
				// sake, wait until it is written).
				_ = s.Started(ctx, []*driver.Message{m})
				s.WaitStarted()
				write("start %s %s %d %d", m.Key, m.ID, m.Attempt, time.Now().UnixNano())
				if m.ID == hang {
					select {} // stuck in the handler until SIGKILL
				}
				time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
				if rand.Float64() < failP {
					write("end %s %s %d %d fail", m.Key, m.ID, m.Attempt, time.Now().UnixNano())
					_ = s.Nack(ctx, m, time.Duration(rand.IntN(20))*time.Millisecond)
					_ = s.Release(ctx, ms[i+n+1:j])
					break
				}
				write("end %s %s %d %d ok", m.Key, m.ID, m.Attempt, time.Now().UnixNano())
				if err := s.Ack(ctx, []*driver.Message{m}); err != nil {
					fmt.Fprintln(os.Stderr, "ack:", err)
				}
			}
			i = j
		}
	}
}

// helperStack consumes subscription "s" through subscribe.Subscriber with
// one worker (so a key's chain waits in the lanes while another key's
// handler runs), recording "start" and "end" lines as helperConsumer does;
// the handler of message KEYORDER_PG_HANG blocks until SIGKILL.
func helperStack() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("KEYORDER_PG_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	lease, _ := time.ParseDuration(os.Getenv("KEYORDER_PG_LEASE"))
	drv, err := postgres.OpenSubscriptionDriver(ctx, pool, os.Getenv("KEYORDER_PG_TOPIC"), "s", &postgres.Options{
		Schema: os.Getenv("KEYORDER_PG_SCHEMA"), Lease: lease, PollInterval: 50 * time.Millisecond,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	write, err := proctest.Records()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	hang := os.Getenv("KEYORDER_PG_HANG")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sub, err := subscribe.New(drv, &subscribe.Config{Workers: 1, MaxOutstanding: 100, Logger: quiet})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	err = sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
		write("start %s %s %d %d", d.Key, d.ID, d.Attempt, time.Now().UnixNano())
		if d.ID == hang {
			select {} // stuck in the handler until SIGKILL
		}
		write("end %s %s %d %d ok", d.Key, d.ID, d.Attempt, time.Now().UnixNano())
		return nil
	})
	fmt.Fprintln(os.Stderr, "run:", err)
	return 2
}

type helper struct{ *proctest.Proc }

func startHelper(t *testing.T, e *env, topic string, lease time.Duration, failP float64, hang string) *helper {
	return startHelperKind(t, e, "consumer", topic, lease, failP, hang)
}

// startHelperKind starts helperConsumer (kind "consumer") or helperStack
// (kind "stack").
func startHelperKind(t *testing.T, e *env, kind, topic string, lease time.Duration, failP float64, hang string) *helper {
	t.Helper()
	return &helper{proctest.Start(t, kind,
		"KEYORDER_PG_URL="+e.url, "KEYORDER_PG_SCHEMA="+e.schema,
		"KEYORDER_PG_TOPIC="+topic, "KEYORDER_PG_LEASE="+lease.String(),
		fmt.Sprintf("KEYORDER_PG_FAIL=%g", failP), "KEYORDER_PG_HANG="+hang)}
}

func (h *helper) kill() { h.Kill() }

type record struct {
	start   bool
	key, id string
	attempt int
	at      int64
	ok      bool
	proc    int
}

func (h *helper) read(t *testing.T, proc int) []record {
	t.Helper()
	var out []record
	for _, fs := range h.Lines(t) {
		if len(fs) < 5 {
			continue
		}
		r := record{start: fs[0] == "start", key: fs[1], id: fs[2], proc: proc}
		r.attempt, _ = strconv.Atoi(fs[3])
		r.at, _ = strconv.ParseInt(fs[4], 10, 64)
		r.ok = len(fs) > 5 && fs[5] == "ok"
		out = append(out, r)
	}
	return out
}

var waitUntil = proctest.WaitUntil

// A consumer process killed with SIGKILL in the middle of a handler: its
// lease expires and the same message is redelivered, as a counted attempt,
// before its successors; what it acknowledged before is not redelivered.
func TestProcessKilledMidHandler(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	e.sub("t", "s", policy.Ordered, nil)
	var ms []*driver.Message
	for i := 1; i <= 6; i++ {
		ms = append(ms, msg("A", fmt.Sprintf("a%d", i)))
	}
	sendBatch(t, tp, ms...)
	h := startHelper(t, e, "t", 2*time.Second, 0, "a3")
	waitUntil(t, 30*time.Second, "the helper to start handling a3", func() bool {
		rs := h.read(t, 0)
		return len(rs) > 0 && rs[len(rs)-1].start && rs[len(rs)-1].id == "a3"
	})
	h.kill()
	// Everything before a3 was acknowledged by the dead process.
	s := e.sub("t", "s", policy.Ordered, nil)
	ctx := ctxT(t, 30*time.Second)
	killed := time.Now()
	got := receiveN(t, ctx, s, 4)
	if el := time.Since(killed); el > 5*time.Second {
		t.Fatalf("redelivered after %v; the lease was 2s", el)
	}
	if !slices.Equal(ids(got), []string{"a3", "a4", "a5", "a6"}) {
		t.Fatalf("after the kill got %v, want a3 first and nothing acked again", ids(got))
	}
	if got[0].Attempt != 2 {
		t.Fatalf("a3 redelivered as attempt %d, want 2 (the lost lease counts)", got[0].Attempt)
	}
	if err := s.Ack(ctx, got); err != nil {
		t.Fatal(err)
	}
}

// Two consumer processes on one Ordered subscription under load, failing
// some messages: checked from the handlers' records, at most one message of
// a key is in flight at any time, a failed message is the next one handled
// for its key, and each key's messages succeed in publish order.
func TestTwoProcessesOrderedUnderLoad(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", &postgres.Options{NotifyDebounce: 2 * time.Millisecond})
	e.sub("t", "s", policy.Ordered, nil)
	const keys, perKey = 50, 40
	hs := []*helper{
		startHelper(t, e, "t", 5*time.Second, 0.05, ""),
		startHelper(t, e, "t", 5*time.Second, 0.05, ""),
	}
	order := map[string][]string{}
	for r := range perKey {
		var batch []*driver.Message
		for k := range keys {
			key := "k" + strconv.Itoa(k)
			id := fmt.Sprintf("%s-%03d", key, r)
			order[key] = append(order[key], id)
			batch = append(batch, msg(key, id))
		}
		sendBatch(t, tp, batch...)
	}
	all := func() []record {
		var rs []record
		for i, h := range hs {
			rs = append(rs, h.read(t, i)...)
		}
		return rs
	}
	waitUntil(t, 120*time.Second, "every message handled successfully", func() bool {
		ok := map[string]bool{}
		for _, r := range all() {
			if !r.start && r.ok {
				ok[r.id] = true
			}
		}
		return len(ok) == keys*perKey
	})
	for _, h := range hs {
		h.kill()
	}
	rs := all()
	procs := map[int]int{}
	type span struct {
		id         string
		start, end int64
		ok         bool
		proc       int
	}
	byKey := map[string][]span{}
	open := map[string]*span{}
	for _, r := range rs {
		k := fmt.Sprint(r.proc, r.id, r.attempt)
		if r.start {
			open[k] = &span{id: r.id, start: r.at, proc: r.proc}
			continue
		}
		sp := open[k]
		if sp == nil {
			t.Fatalf("end without start: %+v", r)
		}
		sp.end, sp.ok = r.at, r.ok
		byKey[r.key] = append(byKey[r.key], *sp)
		procs[r.proc]++
	}
	if len(procs) != 2 {
		t.Fatalf("work went to %d process(es), want both: %v", len(procs), procs)
	}
	for key, spans := range byKey {
		slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.start, b.start) })
		next := 0
		for i, sp := range spans {
			if i > 0 && sp.start < spans[i-1].end {
				t.Fatalf("key %s: %s (process %d) started before %s (process %d) ended",
					key, sp.id, sp.proc, spans[i-1].id, spans[i-1].proc)
			}
			if sp.id != order[key][next] {
				t.Fatalf("key %s: handled %s, expected %s", key, sp.id, order[key][next])
			}
			if sp.ok {
				next++
			}
		}
	}
}

// A consumer process killed while it holds a chain: the lost lease counts as
// an attempt for the message that was running (the first unsettled member),
// never for the members behind it, which were claimed and never started.
func TestProcessKilledHoldingChain(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	e.sub("t", "s", policy.Ordered, nil)
	var ms []*driver.Message
	for i := 1; i <= 6; i++ {
		ms = append(ms, msg("A", fmt.Sprintf("a%d", i)))
	}
	sendBatch(t, tp, ms...)
	h := startHelper(t, e, "t", 2*time.Second, 0, "a3")
	waitUntil(t, 30*time.Second, "the helper to start handling a3", func() bool {
		rs := h.read(t, 0)
		return len(rs) > 0 && rs[len(rs)-1].start && rs[len(rs)-1].id == "a3"
	})
	// The helper claimed the whole chain in one receive: a4..a6 were
	// claimed behind a3 and never started.
	h.kill()
	s := e.sub("t", "s", policy.Ordered, nil)
	ctx := ctxT(t, 30*time.Second)
	got := receiveN(t, ctx, s, 4)
	var attempts []string
	for _, m := range got {
		attempts = append(attempts, fmt.Sprintf("%s@%d", m.ID, m.Attempt))
	}
	if want := []string{"a3@2", "a4@1", "a5@1", "a6@1"}; !slices.Equal(attempts, want) {
		t.Fatalf("after the kill got %v, want %v: only the message that was running lost an attempt", attempts, want)
	}
	if err := s.Ack(ctx, got); err != nil {
		t.Fatal(err)
	}
}

// A consumer that nacks a chain's head and then loses its lease before the
// rest of the chain is given back (a crash between the two): the head's
// failure is counted once, and nothing behind it counts the lost lease. Under
// Exclusive, where the chain runs on past a nacked member, the lost lease
// counts for the first member not nacked.
func TestLostLeaseAfterNack(t *testing.T) {
	for _, tc := range []struct {
		ordering policy.Ordering
		want     []string
	}{
		{policy.Ordered, []string{"a1@2", "a2@1", "a3@1"}},
		{policy.Exclusive, []string{"a1@2", "a2@2", "a3@1"}},
	} {
		t.Run(tc.ordering.String(), func(t *testing.T) {
			e := newEnv(t)
			tp := e.topic("t", nil)
			lease := &postgres.Options{Lease: time.Second, PollInterval: 50 * time.Millisecond}
			crashed := e.sub("t", "s", tc.ordering, lease)
			sendBatch(t, tp, msg("A", "a1"), msg("A", "a2"), msg("A", "a3"))
			ctx := ctxT(t, 30*time.Second)
			got := receiveN(t, ctx, crashed, 3)
			if err := crashed.Started(ctx, got[:1]); err != nil {
				t.Fatal(err)
			}
			if err := crashed.Nack(ctx, got[0], 0); err != nil {
				t.Fatal(err)
			}
			if tc.ordering == policy.Exclusive {
				if err := crashed.Started(ctx, got[1:2]); err != nil {
					t.Fatal(err)
				}
			}
			crashed.WaitStarted()
			// a2 (Exclusive: it runs on) is running when the process dies;
			// its lease expires.
			s := e.sub("t", "s", tc.ordering, lease)
			again := receiveN(t, ctx, s, 3)
			var attempts []string
			for _, m := range again {
				attempts = append(attempts, fmt.Sprintf("%s@%d", m.ID, m.Attempt))
			}
			if !slices.Equal(attempts, tc.want) {
				t.Fatalf("after the lost lease got %v, want %v", attempts, tc.want)
			}
		})
	}
}
