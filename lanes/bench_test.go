package lanes

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"testing"
	"time"

	"github.com/keyorder/keyorder/policy"
)

// The benchmarks push no-op items over benchKeys keys from one producer
// onto benchWorkers workers. BenchmarkBaselineChannels is the plain way to do
// the same: hash the key onto one of benchWorkers goroutines fed by buffered
// channels. Compare msgs/s and allocs/op.
const (
	benchKeys    = 1000
	benchWorkers = 8
)

var benchKeyNames = func() []string {
	ks := make([]string, benchKeys)
	for i := range ks {
		ks[i] = fmt.Sprintf("key-%04d", i)
	}
	return ks
}()

// noop is the handler of every benchmark; called through a variable so the
// baseline cannot inline it away.
var noop Handler[int] = func(ctx context.Context, key string, keyed bool, v int) Result { return Done() }

func reportRate(b *testing.B) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

func BenchmarkBaselineChannels(b *testing.B) {
	type msg struct {
		key string
		v   int
	}
	ctx := context.Background()
	seed := maphash.MakeSeed()
	chans := make([]chan msg, benchWorkers)
	var wg sync.WaitGroup
	for i := range chans {
		c := make(chan msg, CapacityDefault)
		chans[i] = c
		wg.Go(func() {
			for m := range c {
				noop(ctx, m.key, true, m.v)
			}
		})
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		k := benchKeyNames[i%benchKeys]
		chans[maphash.String(seed, k)%benchWorkers] <- msg{k, i}
	}
	for _, c := range chans {
		close(c)
	}
	wg.Wait()
	b.StopTimer()
	reportRate(b)
}

func benchLanes(b *testing.B, cfg *Config) {
	p, err := New(cfg, noop)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if err := p.Submit(ctx, Item{Key: benchKeyNames[i%benchKeys], Keyed: true}, i); err != nil {
			b.Fatal(err)
		}
	}
	for p.Stats() != (Stats{}) {
		time.Sleep(20 * time.Microsecond)
	}
	b.StopTimer()
	reportRate(b)
	if _, err := p.Close(ctx); err != nil {
		b.Fatal(err)
	}
}

func BenchmarkLanesByKey(b *testing.B) {
	benchLanes(b, &Config{Workers: benchWorkers, Assign: ByKey})
}

func BenchmarkLanesByKeyOrdered(b *testing.B) {
	benchLanes(b, &Config{Workers: benchWorkers, Assign: ByKey, Ordering: policy.Ordered})
}

func BenchmarkLanesShared(b *testing.B) {
	benchLanes(b, &Config{Workers: benchWorkers, Assign: Shared})
}

func BenchmarkLanesSharedOrdered(b *testing.B) {
	benchLanes(b, &Config{Workers: benchWorkers, Assign: Shared, Ordering: policy.Ordered})
}

// benchFairKeys are ten tenants, one with 100 times the items of each other.
var benchFairKeys = func() []string {
	var ks []string
	for range 100 {
		ks = append(ks, "t0")
	}
	for t := 1; t < 10; t++ {
		ks = append(ks, fmt.Sprint("t", t))
	}
	return ks
}()

func benchLanesFair(b *testing.B, cfg *Config) {
	p, err := New(cfg, noop)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if err := p.Submit(ctx, Item{Key: benchKeyNames[i%benchKeys], Keyed: true, Fairness: benchFairKeys[i%len(benchFairKeys)]}, i); err != nil {
			b.Fatal(err)
		}
	}
	for p.Stats() != (Stats{}) {
		time.Sleep(20 * time.Microsecond)
	}
	b.StopTimer()
	reportRate(b)
	if _, err := p.Close(ctx); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkLanesByKeyOrderedTenants is BenchmarkLanesByKeyOrdered with
// fairness keys submitted but Fair off: the baseline of the next one.
func BenchmarkLanesByKeyOrderedTenants(b *testing.B) {
	benchLanesFair(b, &Config{Workers: benchWorkers, Assign: ByKey, Ordering: policy.Ordered})
}

func BenchmarkLanesByKeyOrderedFair(b *testing.B) {
	benchLanesFair(b, &Config{Workers: benchWorkers, Assign: ByKey, Ordering: policy.Ordered, Fair: true})
}
