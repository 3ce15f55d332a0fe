// Command lanesbench compares keyed worker lanes with the plain way of keeping
// per-key order on a pool of goroutines: hash the key onto one of n
// goroutines fed by buffered channels.
//
// One producer submits N no-op messages over a set of keys; each run reports
// messages per second and allocations per message (runtime.MemStats.Mallocs
// delta / N). Machines are noisy, so every variant runs several rounds,
// interleaved, and the medians are compared:
//
//	go run ./examples/lanesbench
//	go run ./examples/lanesbench -n 5000000 -rounds 9 -workers 4
package main

import (
	"context"
	"flag"
	"fmt"
	"hash/maphash"
	"log"
	"os"
	"runtime"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/keyorder/keyorder/lanes"
	"github.com/keyorder/keyorder/policy"
)

var (
	nMsgs    = flag.Int("n", 2_000_000, "messages per run")
	rounds   = flag.Int("rounds", 5, "rounds per variant (medians are reported)")
	nKeys    = flag.Int("keys", 1000, "distinct ordering keys")
	nWorkers = flag.Int("workers", 8, "workers (lanes for ByKey)")
	capacity = flag.Int("capacity", lanes.CapacityDefault, "queue capacity per worker or lane")
)

// noop is every variant's handler; a variable, so the baseline cannot inline it.
var noop lanes.Handler[int] = func(ctx context.Context, key string, keyed bool, v int) lanes.Result {
	return lanes.Done()
}

type variant struct {
	name string
	run  func(keys []string) // submits *nMsgs messages and waits until all ran
}

func main() {
	flag.Parse()
	if *nMsgs <= 0 || *rounds <= 0 || *nKeys <= 0 || *nWorkers <= 0 || *capacity <= 0 {
		log.Fatal("lanesbench: -n, -rounds, -keys, -workers and -capacity must be positive")
	}
	keys := make([]string, *nKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%06d", i)
	}
	variants := []variant{
		{"baseline channels", baseline},
		{"lanes ByKey parallel", runLanes(lanes.ByKey, policy.Parallel)},
		{"lanes ByKey ordered", runLanes(lanes.ByKey, policy.Ordered)},
		{"lanes Shared parallel", runLanes(lanes.Shared, policy.Parallel)},
		{"lanes Shared ordered", runLanes(lanes.Shared, policy.Ordered)},
	}
	fmt.Printf("%d messages over %d keys, %d workers, capacity %d, GOMAXPROCS %d, %d rounds\n\n",
		*nMsgs, *nKeys, *nWorkers, *capacity, runtime.GOMAXPROCS(0), *rounds)

	rates := make([][]float64, len(variants))
	allocs := make([][]float64, len(variants))
	ratios := make([][]float64, len(variants)) // per round, against that round's baseline
	for r := range *rounds {
		// Rotate the order each round so no variant always runs first.
		var base float64
		for j := range variants {
			i := (j + r) % len(variants)
			rate, a := measure(variants[i], keys)
			rates[i] = append(rates[i], rate)
			allocs[i] = append(allocs[i], a)
			if i == 0 {
				base = rate
			}
		}
		for i := range variants {
			ratios[i] = append(ratios[i], rates[i][r]/base)
		}
		fmt.Fprintf(os.Stderr, "round %d/%d done\n", r+1, *rounds)
	}

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "variant\tmedian msgs/s\tmin\tmax\tallocs/msg\tratio (of medians)\tratio (median per round)\t")
	baseMedian := median(rates[0])
	for i, v := range variants {
		fmt.Fprintf(w, "%s\t%.0f\t%.0f\t%.0f\t%.4f\t%.2f\t%.2f\t\n", v.name, median(rates[i]),
			slices.Min(rates[i]), slices.Max(rates[i]), median(allocs[i]),
			median(rates[i])/baseMedian, median(ratios[i]))
	}
	w.Flush()
}

// measure runs v once and returns messages per second and allocations per
// message.
func measure(v variant, keys []string) (rate, allocsPerMsg float64) {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	v.run(keys)
	d := time.Since(start)
	runtime.ReadMemStats(&after)
	n := float64(*nMsgs)
	return n / d.Seconds(), float64(after.Mallocs-before.Mallocs) / n
}

// baseline hashes each key onto one of *nWorkers goroutines fed by buffered
// channels: one key stays on one goroutine, so its order is kept.
func baseline(keys []string) {
	type msg struct {
		key string
		v   int
	}
	ctx := context.Background()
	seed := maphash.MakeSeed()
	chans := make([]chan msg, *nWorkers)
	var wg sync.WaitGroup
	for i := range chans {
		c := make(chan msg, *capacity)
		chans[i] = c
		wg.Go(func() {
			for m := range c {
				noop(ctx, m.key, true, m.v)
			}
		})
	}
	n := uint64(len(chans))
	for i := range *nMsgs {
		k := keys[i%len(keys)]
		chans[maphash.String(seed, k)%n] <- msg{k, i}
	}
	for _, c := range chans {
		close(c)
	}
	wg.Wait()
}

func runLanes(a lanes.Assignment, o policy.Ordering) func([]string) {
	return func(keys []string) {
		p, err := lanes.New(&lanes.Config{Workers: *nWorkers, Assign: a, Ordering: o, Capacity: *capacity}, noop)
		if err != nil {
			log.Fatal(err)
		}
		ctx := context.Background()
		for i := range *nMsgs {
			if err := p.Submit(ctx, lanes.Item{Key: keys[i%len(keys)], Keyed: true}, i); err != nil {
				log.Fatal(err)
			}
		}
		for p.Stats() != (lanes.Stats{}) {
			time.Sleep(20 * time.Microsecond)
		}
		if _, err := p.Close(ctx); err != nil {
			log.Fatal(err)
		}
	}
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
