package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// endpoint is one client of one broker resource (a topic and its
// subscription, a queue, a table), fresh for each measurement.
type endpoint interface {
	// publish sends every message of w, each key's in workload order, and
	// returns once the broker has confirmed them all.
	publish(ctx context.Context, w *workload) error
	// consume receives and acknowledges messages, reporting each payload
	// to chk, until ctx ends; then it returns nil, or the error that
	// stopped it earlier.
	consume(ctx context.Context, chk *orderCheck) error
	// close releases the endpoint and, where it can, deletes its resources.
	close()
}

// system is one client under test on a backend: the raw client or
// keyorder with one way of publishing.
type system struct {
	name string
	// ref marks the raw client the ratios divide by (the first system
	// of a backend).
	ref bool
	// refName, when set, names the system this one's ratios divide by
	// instead of the ref (a raw client configured as this system is).
	refName string
	// open returns a fresh endpoint; id is unique within the program's run.
	open func(ctx context.Context, id string) (endpoint, error)
}

// backend is the systems compared side by side on one broker.
type backend struct {
	name    string
	title   string // the broker as the report names it
	note    string // how the systems are configured
	systems []system
	close   func()
	// stats, when set, describes the publish requests of the resource
	// named id (-rpcs).
	stats func(id string) string
	// consumeStats, when set, describes the consume-side requests on the
	// resource named id, which consumed n messages (-rpcs).
	consumeStats func(id string, n int) string
}

// result is one system's figures on one workload (medians over rounds).
type result struct {
	system           string
	ref              bool
	refName          string // see system.refName
	keys             int
	publish, consume float64 // msgs/s
	e2e              float64 // msgs/s, publishing and consuming at once
	violations, dups int64   // over the consume and end-to-end phases, summed over rounds
	load             float64 // 1-minute load average when the system started
}

var runSeq int

func nextID(backend, system string) string {
	runSeq++
	s := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, strings.ToLower(system))
	return fmt.Sprintf("kobench-%s-%s-%d-%d", backend, s, time.Now().Unix()%100000, runSeq)
}

// loadAvg returns the 1-minute load average (0 if unknown).
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f, _ := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	return f
}

// measure runs sys on w o.rounds times: publish (timed), then consume the
// backlog (timed), then on a fresh endpoint publish and consume at once
// (timed from the first publish to the last message handled).
func measure(ctx context.Context, b *backend, sys system, w *workload, o options) (result, error) {
	res := result{system: sys.name, ref: sys.ref, refName: sys.refName, keys: len(w.keys), load: loadAvg()}
	var pubs, cons, e2es []float64
	for range max(o.rounds, 1) {
		pub, con, v, d, err := backlogRun(ctx, b, sys, w, o)
		if err != nil {
			return res, err
		}
		var e2e float64
		var v2, d2 int64
		if !*publishOnly {
			e2e, v2, d2, err = e2eRun(ctx, b, sys, w, o)
			if err != nil {
				return res, err
			}
		}
		pubs, cons, e2es = append(pubs, pub), append(cons, con), append(e2es, e2e)
		res.violations += v + v2
		res.dups += d + d2
	}
	res.publish, res.consume, res.e2e = medianOf(pubs), medianOf(cons), medianOf(e2es)
	return res, nil
}

// alternate runs the rounds of the systems in turn (round 1 of each, then
// round 2 of each, …) instead of every round of one system before the
// next, so that a change of the machine's load during the run weighs on
// every system alike.
var alternate = flag.Bool("alternate", false, "run the rounds of the systems in turn (with -rounds > 1)")

// measureAll measures each of systems on w (see measure), their rounds in
// turn with -alternate. It returns their results in order.
func measureAll(ctx context.Context, b *backend, systems []system, w *workload, o options) ([]result, error) {
	out := make([]result, len(systems))
	if !*alternate {
		for i, sys := range systems {
			res, err := measure(ctx, b, sys, w, o)
			if err != nil {
				return nil, err
			}
			out[i] = res
		}
		return out, nil
	}
	one := o
	one.rounds = 1
	rounds := make([][]result, len(systems))
	for range max(o.rounds, 1) {
		for i, sys := range systems {
			res, err := measure(ctx, b, sys, w, one)
			if err != nil {
				return nil, err
			}
			rounds[i] = append(rounds[i], res)
		}
	}
	for i, rs := range rounds {
		res := rs[0]
		var pubs, cons, e2es, loads []float64
		res.violations, res.dups = 0, 0
		for _, r := range rs {
			pubs, cons, e2es, loads = append(pubs, r.publish), append(cons, r.consume), append(e2es, r.e2e), append(loads, r.load)
			res.violations += r.violations
			res.dups += r.dups
		}
		res.publish, res.consume, res.e2e, res.load = medianOf(pubs), medianOf(cons), medianOf(e2es), medianOf(loads)
		out[i] = res
	}
	return out, nil
}

func medianOf(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

func backlogRun(ctx context.Context, b *backend, sys system, w *workload, o options) (pub, con float64, viol, dups int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	id := nextID(b.name, sys.name)
	ep, err := sys.open(ctx, id)
	if err != nil {
		return 0, 0, 0, 0, fmt.Errorf("%s: open: %w", sys.name, err)
	}
	defer ep.close()
	start := time.Now()
	if err := ep.publish(ctx, w); err != nil {
		return 0, 0, 0, 0, fmt.Errorf("%s: publish: %w", sys.name, err)
	}
	pub = float64(w.n()) / time.Since(start).Seconds()
	if *rpcs && b.stats != nil {
		fmt.Fprintf(os.Stderr, "  %5d keys  %-33s publish %9.0f msgs/s (load %.2f): %s\n", len(w.keys), sys.name, pub, loadAvg(), b.stats(id))
	}
	if *publishOnly {
		return pub, 0, 0, 0, nil
	}
	chk := newOrderCheck(w)
	cpu0 := brokerCPU()
	el, err := consumeAll(ctx, ep, chk, time.Now(), nil)
	if cpu0 >= 0 && err == nil {
		cpu := brokerCPU() - cpu0
		fmt.Fprintf(os.Stderr, "  %5d keys  %-33s consume: server CPU %.1f ms per 1,000 messages (%.0f ms in %.1f s)\n", len(w.keys), sys.name, cpu*1e6/float64(w.n()), cpu*1000, el.Seconds())
	}
	if err != nil {
		return 0, 0, 0, 0, fmt.Errorf("%s: consume: %w", sys.name, err)
	}
	if *rpcs && b.consumeStats != nil {
		fmt.Fprintf(os.Stderr, "  %5d keys  %-33s consume %9.0f msgs/s (load %.2f):%s\n", len(w.keys), sys.name, float64(w.n())/el.Seconds(), loadAvg(), b.consumeStats(id, w.n()))
	}
	return pub, float64(w.n()) / el.Seconds(), chk.viol.Load(), chk.dups.Load(), nil
}

func e2eRun(ctx context.Context, b *backend, sys system, w *workload, o options) (rate float64, viol, dups int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	ep, err := sys.open(ctx, nextID(b.name, sys.name))
	if err != nil {
		return 0, 0, 0, fmt.Errorf("%s: open: %w", sys.name, err)
	}
	defer ep.close()
	chk := newOrderCheck(w)
	start := time.Now()
	el, err := consumeAll(ctx, ep, chk, start, func(ctx context.Context) error { return ep.publish(ctx, w) })
	if err != nil {
		return 0, 0, 0, fmt.Errorf("%s: end-to-end: %w", sys.name, err)
	}
	return float64(w.n()) / el.Seconds(), chk.viol.Load(), chk.dups.Load(), nil
}

// consumeAll runs ep.consume (and pub, if set, at the same time) until chk
// has seen every message, and returns the time from start to then.
func consumeAll(ctx context.Context, ep endpoint, chk *orderCheck, start time.Time, pub func(context.Context) error) (time.Duration, error) {
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Go(func() {
		if err := ep.consume(cctx, chk); err != nil && !errors.Is(err, context.Canceled) {
			errs <- err
		}
	})
	if pub != nil {
		wg.Go(func() {
			if err := pub(cctx); err != nil && cctx.Err() == nil {
				errs <- fmt.Errorf("publish: %w", err)
			}
		})
	}
	var el time.Duration
	var err error
	select {
	case <-chk.done:
		el = time.Since(start)
	case err = <-errs:
	case <-ctx.Done():
		err = fmt.Errorf("%d of %d messages handled: %w", chk.handled.Load(), chk.n, ctx.Err())
	}
	stop()
	wg.Wait()
	return el, err
}

// brokerCPU returns the CPU seconds used so far by the process
// KEYORDER_BENCH_SERVER_PID names (the broker, on this machine, with its
// children), or -1. The broker's CPU per message consumed depends less on
// the machine's load than a rate does.
func brokerCPU() float64 {
	pid := os.Getenv("KEYORDER_BENCH_SERVER_PID")
	if pid == "" {
		return -1
	}
	t := serverCPU{pid: pid}.total()
	if t < 0 {
		return -1
	}
	return t.Seconds()
}
