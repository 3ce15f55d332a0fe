// The fairness benchmark (-backend fairness): ten tenants on one Ordered
// subscription of the memory broker, one publishing 100 times as much as
// each of the others, with and without fair scheduling
// (subscribe.Config.FairnessKey).
//
// Latency run: the big tenant publishes its share in bursts (a burst every
// -fair-period), each small tenant one message at a time, evenly; the
// handler sleeps -fair-work, so 8 workers run at about 90% of their
// capacity on average while each burst queues up in the process. Reported:
// the small tenants' and the big tenant's publish-to-handler latency (p50,
// p99, max) and the throughput. Throughput run: the same mix published up
// front, consumed by a no-op handler: the scheduler's own cost.
//
// Both modes use the same flow control (MaxOutstanding -fair-window), so
// the only difference is the order in which the lanes take what the
// process has received. Rounds alternate the modes; medians are reported.

package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/keyorder/keyorder"

	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// fairOptions configures the fairness benchmark.
type fairOptions struct {
	perSmall int           // messages per small tenant (the big one: 100x)
	bursts   int           // bursts of the big tenant
	work     time.Duration // handler time in the latency run
	window   int           // MaxOutstanding
	workers  int
	tpN      int // messages of the throughput run
	rounds   int
	out      string
	backend  string    // memory or postgres
	only     string    // "arrival" or "fair": run one mode only (profiling)
	factory  koFactory // set from backend
}

const (
	fairTenants = 10 // tenant t0 is the big one
	fairBigX    = 100
)

// fairResult is one mode's figures.
type fairResult struct {
	mode               string
	smallP50, smallP99 time.Duration
	smallMax           time.Duration
	bigP50, bigP99     time.Duration
	latRate, noopRate  float64       // msgs/s: latency run, no-op throughput run
	noopCPU            time.Duration // CPU (user+system) per message, no-op run
	violations         int
}

func fairnessBench(ctx context.Context, o fairOptions, stdout io.Writer) error {
	// Rounds alternate the two modes, so a change in the machine's load
	// hits both alike.
	runs := make([][]fairResult, 2)
	for range max(o.rounds, 1) {
		for i, fair := range []bool{false, true} {
			if o.only != "" && o.only != map[bool]string{false: "arrival", true: "fair"}[fair] {
				runs[i] = append(runs[i], fairResult{mode: "skipped"})
				continue
			}
			// A fresh backend per run (on PostgreSQL a fresh schema): the
			// rows earlier runs left behind must not slow the later mode.
			f, cleanup, err := fairFactory(ctx, o.backend)
			if err != nil {
				return err
			}
			o.factory = f
			r, err := fairRun(ctx, o, fair)
			cleanup()
			if err != nil {
				return err
			}
			runs[i] = append(runs[i], r)
		}
	}
	res := []fairResult{medianFair(runs[0]), medianFair(runs[1])}
	md := fairMarkdown(o, res)
	fmt.Fprint(stdout, md)
	if o.out != "" {
		if err := os.MkdirAll(o.out, 0o755); err != nil {
			return err
		}
		name := "fairness"
		if o.backend != "memory" {
			name += "-" + o.backend
		}
		if err := os.WriteFile(filepath.Join(o.out, name+".md"), []byte(md), 0o644); err != nil {
			return err
		}
		if err := fairChart(o, res, filepath.Join(o.out, name+".png")); err != nil {
			return err
		}
	}
	for _, r := range res {
		if r.violations > 0 {
			return fmt.Errorf("%s: %d per-key order violations", r.mode, r.violations)
		}
	}
	return nil
}

func medianFair(rs []fairResult) fairResult {
	if len(rs) == 1 {
		return rs[0]
	}
	med := func(get func(fairResult) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = get(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	d := func(get func(fairResult) time.Duration) time.Duration {
		return time.Duration(med(func(r fairResult) float64 { return float64(get(r)) }))
	}
	out := rs[0]
	out.smallP50 = d(func(r fairResult) time.Duration { return r.smallP50 })
	out.smallP99 = d(func(r fairResult) time.Duration { return r.smallP99 })
	out.smallMax = d(func(r fairResult) time.Duration { return r.smallMax })
	out.bigP50 = d(func(r fairResult) time.Duration { return r.bigP50 })
	out.bigP99 = d(func(r fairResult) time.Duration { return r.bigP99 })
	out.latRate = med(func(r fairResult) float64 { return r.latRate })
	out.noopRate = med(func(r fairResult) float64 { return r.noopRate })
	out.noopCPU = d(func(r fairResult) time.Duration { return r.noopCPU })
	for _, r := range rs {
		out.violations = max(out.violations, r.violations)
	}
	return out
}

// fairMsg is one message of the mix: its tenant, account and sequence
// number within its key.
type fairMsg struct {
	tenant, account, seq int
}

// fairMix returns the messages in publishing order for the throughput run:
// the big tenant's bursts with the small tenants' messages spread evenly.
func fairMix(perSmall int) []fairMsg {
	var out []fairMsg
	seq := map[[2]int]int{}
	add := func(t, a int) {
		k := [2]int{t, a}
		seq[k]++
		out = append(out, fairMsg{t, a, seq[k]})
	}
	for i := range perSmall {
		for j := range fairBigX {
			add(0, (i*fairBigX+j)%100)
		}
		for t := 1; t < fairTenants; t++ {
			add(t, i%10)
		}
	}
	return out
}

func fairRun(ctx context.Context, o fairOptions, fair bool) (fairResult, error) {
	mode := "arrival order"
	if fair {
		mode = "fair (round robin by tenant)"
	}
	r := fairResult{mode: mode}
	lat, err := fairLatency(ctx, o, fair)
	if err != nil {
		return r, err
	}
	r.smallP50, r.smallP99, r.smallMax = lat.small[0], lat.small[1], lat.small[2]
	r.bigP50, r.bigP99 = lat.big[0], lat.big[1]
	r.latRate, r.violations = lat.rate, lat.violations
	n := 0
	for n < o.tpN {
		n += fairBigX + fairTenants - 1
	}
	noop, cpu, v, err := fairThroughput(ctx, o, fair, fairMix(n/(fairBigX+fairTenants-1)))
	if err != nil {
		return r, err
	}
	r.noopRate, r.noopCPU, r.violations = noop, cpu, r.violations+v
	return r, nil
}

type fairLat struct {
	small, big [3]time.Duration // p50, p99, max
	rate       float64
	violations int
}

// fairSetup opens a fresh topic and Ordered subscription on the
// benchmark's backend, a publisher and a subscriber.
func fairSetup(ctx context.Context, o fairOptions, fair bool) (*publish.Publisher, *subscribe.Subscriber, error) {
	fairSeq++
	d, err := o.factory(ctx, fmt.Sprintf("fair%d_%d", time.Now().UnixNano()%1e9, fairSeq))
	if err != nil {
		return nil, nil, err
	}
	p, err := d.openPub(ctx, &publish.Config{MaxBatch: 1000, Logger: quiet(),
		KeyFunc: keyorder.CompositeKey(keyorder.FairnessKeyPart(), keyorder.HeaderPart("account"))})
	if err != nil {
		return nil, nil, err
	}
	cfg := &subscribe.Config{Workers: o.workers, MaxOutstanding: o.window, Logger: quiet()}
	if fair {
		cfg.FairnessKey = subscribe.FairnessKeyHeader
	}
	s, err := d.openSub(ctx, cfg)
	if err != nil {
		p.Close(context.Background())
		return nil, nil, err
	}
	return p, s, nil
}

var fairSeq int

// fairFactory returns the topic-and-subscription factory of -fair-backend
// (memory, or postgres under testenv) and its cleanup.
func fairFactory(ctx context.Context, name string) (koFactory, func(), error) {
	switch name {
	case "memory":
		b := memory.NewBroker()
		return func(_ context.Context, id string) (*koDriver, error) {
			if err := b.CreateSubscription(id, id, &memory.SubscriptionOptions{Ordering: policy.Ordered, MaxBatch: 1000}); err != nil {
				return nil, err
			}
			return &koDriver{
				openPub: func(_ context.Context, cfg *publish.Config) (*publish.Publisher, error) { return b.OpenTopic(id, cfg) },
				openSub: func(_ context.Context, cfg *subscribe.Config) (*subscribe.Subscriber, error) {
					return b.OpenSubscription(id, cfg)
				},
				cleanup: func() {},
			}, nil
		}, func() {}, nil
	case "postgres":
		url, err := env("KEYORDER_PG_URL", "postgres")
		if err != nil {
			return nil, nil, err
		}
		pool, err := pgxpool.New(ctx, withPoolSize(url, 20))
		if err != nil {
			return nil, nil, err
		}
		schema := fmt.Sprintf("kofair_%d", time.Now().UnixNano()%1e9)
		cleanup := func() {
			_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
			pool.Close()
		}
		if _, err := postgres.Migrate(ctx, pool, postgres.DirectionUp, &postgres.MigrateOptions{Schema: schema}); err != nil {
			cleanup()
			return nil, nil, err
		}
		opts := &postgres.Options{Schema: schema, Create: true, MaxBatch: pgBatch, Logger: quiet(),
			Subscription: &postgres.SubscriptionOptions{Ordering: policy.Ordered}}
		admin, err := postgres.NewAdmin(pool, opts)
		if err != nil {
			cleanup()
			return nil, nil, err
		}
		return func(ctx context.Context, id string) (*koDriver, error) {
			t, err := postgres.OpenTopic(ctx, pool, id, opts, nil)
			if err != nil {
				return nil, err
			}
			if err := t.Close(ctx); err != nil {
				return nil, err
			}
			if err := admin.CreateSubscription(ctx, id, "fair", opts.Subscription); err != nil {
				return nil, err
			}
			return &koDriver{
				openPub: func(ctx context.Context, cfg *publish.Config) (*publish.Publisher, error) {
					return postgres.OpenTopic(ctx, pool, id, opts, cfg)
				},
				openSub: func(ctx context.Context, cfg *subscribe.Config) (*subscribe.Subscriber, error) {
					return postgres.OpenSubscription(ctx, pool, id, "fair", opts, cfg)
				},
				cleanup: func() {},
			}, nil
		}, cleanup, nil
	}
	return nil, nil, fmt.Errorf("-fair-backend %q: want memory or postgres", name)
}

func fairMessage(m fairMsg, at time.Time) *keyorder.Message {
	return &keyorder.Message{
		Payload: []byte(strconv.FormatInt(at.UnixNano(), 10) + " " + strconv.Itoa(m.seq)),
		Headers: map[string]string{
			keyorder.HeaderFairnessKey: "t" + strconv.Itoa(m.tenant),
			"account":                  "a" + strconv.Itoa(m.account),
		},
	}
}

// fairCheck records per-key order and returns a handler's bookkeeping.
type fairCheck struct {
	mu         sync.Mutex
	last       map[string]int
	violations int
	small, big []time.Duration
	done       atomic.Int64
}

func (c *fairCheck) record(d *keyorder.Delivery, now time.Time) {
	ts, seqs, _ := strings.Cut(string(d.Payload), " ")
	pub, _ := strconv.ParseInt(ts, 10, 64)
	seq, _ := strconv.Atoi(seqs)
	lat := now.Sub(time.Unix(0, pub))
	c.mu.Lock()
	if seq <= c.last[d.Key] {
		c.violations++
	}
	c.last[d.Key] = seq
	if d.Headers[keyorder.HeaderFairnessKey] == "t0" {
		c.big = append(c.big, lat)
	} else {
		c.small = append(c.small, lat)
	}
	c.mu.Unlock()
	c.done.Add(1)
}

func pct(ds []time.Duration) [3]time.Duration {
	if len(ds) == 0 {
		return [3]time.Duration{}
	}
	slices.Sort(ds)
	at := func(p float64) time.Duration { return ds[min(len(ds)-1, int(p*float64(len(ds))))] }
	return [3]time.Duration{at(0.50), at(0.99), ds[len(ds)-1]}
}

func fairLatency(ctx context.Context, o fairOptions, fair bool) (fairLat, error) {
	var out fairLat
	p, s, err := fairSetup(ctx, o, fair)
	if err != nil {
		return out, err
	}
	defer p.Close(context.Background())
	c := &fairCheck{last: map[string]int{}}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	runErr := make(chan error, 1)
	go func() {
		runErr <- s.Run(rctx, func(ctx context.Context, d *keyorder.Delivery) error {
			c.record(d, time.Now())
			time.Sleep(o.work)
			return nil
		})
	}()
	// The load: capacity is workers/work msgs/s; the mix is published at
	// 90% of it: the big tenant's share in bursts, the small tenants'
	// evenly, each tenant at its own offset.
	total := o.perSmall * (fairBigX + fairTenants - 1)
	capacity := float64(o.workers) / o.work.Seconds()
	span := time.Duration(float64(total) / (0.9 * capacity) * float64(time.Second))
	period := span / time.Duration(o.bursts)
	perBurst := o.perSmall * fairBigX / o.bursts
	smallEvery := span / time.Duration(o.perSmall)
	type ev struct {
		at     time.Duration
		tenant int
		n      int // messages (bursts)
	}
	var evs []ev
	for b := range o.bursts {
		evs = append(evs, ev{at: time.Duration(b) * period, tenant: 0, n: perBurst})
	}
	for i := range o.perSmall {
		for t := 1; t < fairTenants; t++ {
			evs = append(evs, ev{at: time.Duration(i)*smallEvery + time.Duration(t)*smallEvery/fairTenants, tenant: t, n: 1})
		}
	}
	slices.SortStableFunc(evs, func(a, b ev) int { return int(a.at - b.at) })
	seq := map[[2]int]int{}
	acct := map[int]int{}
	start := time.Now()
	sent := 0
	for _, e := range evs {
		time.Sleep(time.Until(start.Add(e.at)))
		now := time.Now()
		ms := make([]*keyorder.Message, 0, e.n)
		for range e.n {
			a := acct[e.tenant]
			acct[e.tenant]++
			if e.tenant == 0 {
				a %= 100
			} else {
				a %= 10
			}
			k := [2]int{e.tenant, a}
			seq[k]++
			ms = append(ms, fairMessage(fairMsg{e.tenant, a, seq[k]}, now))
		}
		if _, err := p.PublishBatch(ctx, ms); err != nil {
			return out, err
		}
		sent += len(ms)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for c.done.Load() < int64(sent) {
		if time.Now().After(deadline) {
			return out, fmt.Errorf("fairness: %d of %d handled after 5 minutes", c.done.Load(), sent)
		}
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	stop()
	if err := <-runErr; err != nil {
		return out, err
	}
	s.Close(context.Background())
	c.mu.Lock()
	defer c.mu.Unlock()
	out.small, out.big = pct(c.small), pct(c.big)
	out.rate = float64(sent) / elapsed.Seconds()
	out.violations = c.violations
	return out, nil
}

// fairThroughput publishes the mix up front, then consumes it with a no-op
// handler and returns msgs/s and the process's CPU time per message while
// consuming (steadier than msgs/s on a shared machine).
func fairThroughput(ctx context.Context, o fairOptions, fair bool, mix []fairMsg) (float64, time.Duration, int, error) {
	p, s, err := fairSetup(ctx, o, fair)
	if err != nil {
		return 0, 0, 0, err
	}
	defer p.Close(context.Background())
	now := time.Now()
	for chunk := range slices.Chunk(mix, 1000) {
		ms := make([]*keyorder.Message, len(chunk))
		for i, m := range chunk {
			ms[i] = fairMessage(m, now)
		}
		if _, err := p.PublishBatch(ctx, ms); err != nil {
			return 0, 0, 0, err
		}
	}
	c := &fairCheck{last: map[string]int{}}
	cpu0 := cpuTime()
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	runErr := make(chan error, 1)
	start := time.Now()
	go func() {
		runErr <- s.Run(rctx, func(ctx context.Context, d *keyorder.Delivery) error {
			c.record(d, now)
			return nil
		})
	}()
	deadline := time.Now().Add(5 * time.Minute)
	for c.done.Load() < int64(len(mix)) {
		if time.Now().After(deadline) {
			return 0, 0, 0, fmt.Errorf("fairness: throughput run timed out")
		}
		time.Sleep(100 * time.Microsecond)
	}
	elapsed := time.Since(start)
	cpu := (cpuTime() - cpu0) / time.Duration(len(mix))
	stop()
	if err := <-runErr; err != nil {
		return 0, 0, 0, err
	}
	s.Close(context.Background())
	return float64(len(mix)) / elapsed.Seconds(), cpu, c.violations, nil
}

// cpuTime returns the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

func fairMarkdown(o fairOptions, res []fairResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "### Fairness: 10 tenants, one publishing 100x each of the others (%s, Ordered)\n\n", o.backend)
	fmt.Fprintf(&b, "%s UTC. ", time.Now().UTC().Format("2006-01-02 15:04"))
	fmt.Fprintf(&b, "%d workers, MaxOutstanding %d, handler %v; latency run: %d messages per small tenant, %d for the big one in %d bursts, offered at 90%% of capacity; throughput run: %d messages up front, no-op handler. Median of %d run(s).\n\n",
		o.workers, o.window, o.work, o.perSmall, o.perSmall*fairBigX, o.bursts, o.tpN, max(o.rounds, 1))
	b.WriteString("| scheduling | small tenants p50 | p99 | max | big tenant p50 | p99 | latency run msgs/s | no-op msgs/s | no-op CPU/msg |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range res {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %.1f µs |\n", r.mode, ms(r.smallP50), ms(r.smallP99), ms(r.smallMax),
			ms(r.bigP50), ms(r.bigP99), rate(r.latRate), rate(r.noopRate), float64(r.noopCPU)/float64(time.Microsecond))
	}
	if len(res) == 2 && res[0].noopRate > 0 && res[0].noopCPU > 0 {
		fmt.Fprintf(&b, "\nFair scheduling: small tenants' p99 %s -> %s; no-op throughput %.2fx and CPU per message %.2fx, latency-run throughput %.2fx of arrival order.\n",
			ms(res[0].smallP99), ms(res[1].smallP99), res[1].noopRate/res[0].noopRate, float64(res[1].noopCPU)/float64(res[0].noopCPU), res[1].latRate/res[0].latRate)
	}
	return b.String()
}

func fairChart(o fairOptions, res []fairResult, path string) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Fairness (%s): small tenants' latency behind a tenant publishing 100x", o.backend)
	p.Y.Label.Text = "publish -> handler (ms)"
	labels := []string{"small p50", "small p99", "small max", "big p50", "big p99"}
	w := vg.Points(18)
	for i, r := range res {
		vals := plotter.Values{}
		for _, d := range []time.Duration{r.smallP50, r.smallP99, r.smallMax, r.bigP50, r.bigP99} {
			vals = append(vals, float64(d)/float64(time.Millisecond))
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.Color = palette[(i+1)%len(palette)]
		bars.LineStyle.Width = 0
		bars.Offset = w * vg.Length(float64(i)-0.5)
		p.Add(bars)
		p.Legend.Add(fmt.Sprintf("%s (no-op: %.1f µs CPU/msg)", r.mode, float64(r.noopCPU)/float64(time.Microsecond)), bars)
	}
	// Log scale: the big tenant's seconds would flatten the small
	// tenants' milliseconds.
	hi := 1.0
	for _, r := range res {
		hi = max(hi, float64(max(r.smallMax, r.bigP99))/float64(time.Millisecond))
	}
	p.Y.Scale = floorLog{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 1, hi*8
	p.Y.Label.Text = "publish -> handler (ms, log scale)"
	p.Legend.Top = true
	p.Legend.Left = true
	p.NominalX(labels...)
	p.Add(plotter.NewGrid())
	return p.Save(8*vg.Inch, 4.5*vg.Inch, path)
}

// fairnessMain runs -backend fairness. With $KEYORDER_BENCH_CPUPROFILE it
// writes a CPU profile of the whole run there.
func fairnessMain(ctx context.Context, o fairOptions) {
	defer startCPUProfile()()
	if err := fairnessBench(ctx, o, os.Stdout); err != nil {
		log.Fatalf("bench: fairness: %v", err)
	}
}
