// Command watermillbench measures what keyorder costs a Watermill router,
// side by side in one run: a router over gochannel (Watermill's in-memory
// Pub/Sub) without and with keyorder's middleware, and a router over
// keyorder's memory backend through keyorder's Subscriber. Every variant
// handles the same N messages spread over a set of keys with a no-op
// handler; a producer publishes them in batches while the router runs, and
// the clock stops when the handler has seen all N. Variants run
// interleaved for several rounds and the medians are compared:
//
//	go run ./examples/watermillbench
//	go run ./examples/watermillbench -n 200000 -rounds 5 -keys 1000
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/keyorder/keyorder"
	_ "github.com/keyorder/keyorder/adapters/memory"
	wmk "github.com/keyorder/keyorder/adapters/watermill"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

var (
	nMsgs    = flag.Int("n", 100_000, "messages per run")
	rounds   = flag.Int("rounds", 5, "rounds per variant (medians are reported)")
	nKeys    = flag.Int("keys", 1000, "distinct ordering keys")
	batch    = flag.Int("batch", 100, "messages per Publish call")
	nWorkers = flag.Int("workers", 64, "keyorder Subscriber workers and middleware workers")
	only     = flag.Int("only", -1, "run only this variant (0, 1, 2), e.g. for -cpuprofile")
	cpuprof  = flag.String("cpuprofile", "", "write a CPU profile of the runs to this file")
)

type variant struct {
	name string
	run  func(run int) (time.Duration, error)
}

// cpuTime is the process's user+system CPU time so far. On a shared
// machine wall-clock throughput swings with the neighbours' load; CPU time
// per message is the steadier comparison, so both are reported.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func main() {
	flag.Parse()
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	variants := []variant{
		{"router over gochannel", func(int) (time.Duration, error) { return gochannelRun(false) }},
		{"router over gochannel + keyorder middleware", func(int) (time.Duration, error) { return gochannelRun(true) }},
		{"router over keyorder memory (Subscriber)", keyorderRun},
	}
	if *only >= 0 {
		variants = variants[*only : *only+1]
	}
	if *cpuprof != "" {
		f, err := os.Create(*cpuprof)
		if err != nil {
			log.Fatal(err)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	results := make([][]float64, len(variants))
	cpu := make([][]float64, len(variants))
	for r := range *rounds {
		for i, v := range variants {
			c0 := cpuTime()
			d, err := v.run(r)
			if err != nil {
				log.Fatalf("%s: %v", v.name, err)
			}
			results[i] = append(results[i], float64(*nMsgs)/d.Seconds())
			cpu[i] = append(cpu[i], float64((cpuTime()-c0).Microseconds())/float64(*nMsgs))
		}
	}
	fmt.Printf("%d messages over %d keys, no-op handler, batches of %d, %d rounds, GOMAXPROCS=%d, %s\n\n",
		*nMsgs, *nKeys, *batch, *rounds, runtime.GOMAXPROCS(0), runtime.Version())
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "variant\tmedian msgs/s\tmin\tmax\tvs gochannel\tCPU µs/msg\tvs gochannel\t")
	base, cbase := median(results[0]), median(cpu[0])
	for i, v := range variants {
		m, c := median(results[i]), median(cpu[i])
		fmt.Fprintf(w, "%s\t%.0f\t%.0f\t%.0f\t%.2f\t%.1f\t%.2f\t\n", v.name, m, slices.Min(results[i]), slices.Max(results[i]), m/base, c, c/cbase)
	}
	w.Flush()
	if len(variants) < 3 {
		return
	}
	fmt.Printf("\nmiddleware cost: %.1f%% of router throughput, %.1f%% more CPU per message (goal: <= 20%%)\n",
		(1-median(results[1])/base)*100, (median(cpu[1])/cbase-1)*100)
	fmt.Printf("keyorder memory vs gochannel: %.2fx throughput, %.2fx CPU per message (goal: throughput >= 1.00x)\n",
		median(results[2])/base, median(cpu[2])/cbase)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// messages returns the run's messages, keyed round-robin.
func messages() []*message.Message {
	ms := make([]*message.Message, *nMsgs)
	for i := range ms {
		m := message.NewMessage(strconv.Itoa(i), []byte("x"))
		m.Metadata.Set(keyorder.HeaderPartitionKey, "key-"+strconv.Itoa(i%*nKeys))
		ms[i] = m
	}
	return ms
}

// measure runs a router consuming sub, publishes ms through pub and returns
// the time until the handler has seen them all.
func measure(pub message.Publisher, sub message.Subscriber, topic string, mws ...message.HandlerMiddleware) (time.Duration, error) {
	ms := messages()
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return 0, err
	}
	router.AddMiddleware(mws...)
	var seen atomic.Int64
	all := make(chan struct{})
	router.AddConsumerHandler("noop", topic, sub, func(*message.Message) error {
		if seen.Add(1) == int64(len(ms)) {
			close(all)
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	<-router.Running()
	runtime.GC()
	start := time.Now()
	go func() {
		for i := 0; i < len(ms); i += *batch {
			if err := pub.Publish(topic, ms[i:min(i+*batch, len(ms))]...); err != nil {
				log.Fatal(err)
			}
		}
	}()
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
		return 0, fmt.Errorf("only %d of %d handled in 5 minutes", seen.Load(), len(ms))
	}
	d := time.Since(start)
	cancel()
	return d, <-done
}

func gochannelRun(withMiddleware bool) (time.Duration, error) {
	ps := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer ps.Close()
	if !withMiddleware {
		return measure(ps, ps, "bench")
	}
	km, err := wmk.NewMiddleware(policy.Ordered, &wmk.MiddlewareConfig{Workers: *nWorkers})
	if err != nil {
		return 0, err
	}
	defer km.Close(context.Background())
	return measure(ps, ps, "bench", km.Middleware)
}

func keyorderRun(run int) (time.Duration, error) {
	topic := fmt.Sprintf("bench-%d", run)
	pub, err := wmk.NewPublisher(wmk.PublisherConfig{URL: "mem://{topic}"})
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	sub, err := wmk.NewSubscriber(wmk.SubscriberConfig{
		URL:       "mem://{topic}?subscription={topic}.{group}&ordering=ordered",
		Group:     "bench",
		Subscribe: &subscribe.Config{Workers: *nWorkers},
	})
	if err != nil {
		return 0, err
	}
	defer sub.Close()
	if err := sub.SubscribeInitialize(topic); err != nil {
		return 0, err
	}
	return measure(pub, sub, topic)
}
