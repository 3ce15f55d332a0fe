// Command bench compares keyorder's native PostgreSQL queue with River and
// watermill-sql on one PostgreSQL server, side by side in one run, and prints
// msgs/s and ratios.
//
// It is a module of its own so that users of keyorder never inherit River's
// or Watermill's dependencies.
//
//	cd integration/bench && go run . -url postgres://postgres@127.0.0.1:55432/postgres
//
// Every system publishes -n messages of -size bytes in batches of -batch
// (River: InsertMany; watermill-sql: Publish with many messages; keyorder:
// SendBatch), then consumes them with a no-op handler. keyorder runs under
// Parallel and under Ordered over 10, 1,000 and 10,000 keys; then the
// backlog test (rate with 10,000 vs 200,000 waiting), the idle latency test
// (publish→handler with NOTIFY) and the retention test (table sizes under a
// long steady run).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

type config struct {
	url        string
	n          int
	size       int
	batch      int
	consumers  int
	recvBatch  int
	retention  time.Duration
	only       string
	backlogBig int
	rounds     int
}

func main() {
	var c config
	flag.StringVar(&c.url, "url", os.Getenv("KEYORDER_PG_URL"), "PostgreSQL URL (default $KEYORDER_PG_URL)")
	flag.IntVar(&c.n, "n", 50000, "messages per throughput run")
	flag.IntVar(&c.size, "size", 100, "payload bytes")
	flag.IntVar(&c.batch, "batch", 1000, "publish batch size")
	flag.IntVar(&c.consumers, "consumers", 4, "keyorder consumer goroutines (each its own Subscription)")
	flag.IntVar(&c.recvBatch, "recv", 1000, "keyorder messages per Receive")
	flag.DurationVar(&c.retention, "retention", 60*time.Second, "duration of the retention run (0: skip)")
	flag.IntVar(&c.backlogBig, "backlog", 200000, "large backlog for the flatness test (0: skip)")
	flag.IntVar(&c.rounds, "rounds", 3, "runs of each throughput measurement; the median is reported (the machine may be shared)")
	flag.StringVar(&c.only, "only", "", "comma-separated subset: river,watermill,keyorder,keys,backlog,latency,retention")
	flag.Parse()
	if c.url == "" {
		log.Fatal("bench: no -url and no KEYORDER_PG_URL")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, withPoolSize(c.url, 20))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	var version string
	_ = pool.QueryRow(ctx, "SHOW server_version").Scan(&version)
	fmt.Printf("bench: PostgreSQL %s, %d messages of %d bytes, publish batches of %d, median of %d runs each\n\n",
		version, c.n, c.size, c.batch, c.rounds)

	run := func(name string) bool {
		if c.only == "" {
			return true
		}
		for _, s := range strings.Split(c.only, ",") {
			if s == name {
				return true
			}
		}
		return false
	}
	r := results{}
	if run("river") {
		r.riverPub, r.riverCon = median(c, func() (float64, float64, error) { return benchRiver(ctx, pool, c) })
		report("river", "insert (InsertMany)", r.riverPub)
		report("river", "work (no-op, FetchCooldown 1ms)", r.riverCon)
	}
	if run("watermill") {
		r.wmPub, r.wmCon = median(c, func() (float64, float64, error) { return benchWatermill(ctx, pool, c) })
		report("watermill-sql", "publish (batched)", r.wmPub)
		report("watermill-sql", "consume", r.wmCon)
	}
	if run("keyorder") {
		_, r.koPar = median(c, func() (float64, float64, error) { return benchKeyorder(ctx, pool, c, "parallel", 1000, c.n) })
		report("keyorder", "consume Parallel", r.koPar)
		r.koPub, r.ko1000 = median(c, func() (float64, float64, error) { return benchKeyorder(ctx, pool, c, "ordered", 1000, c.n) })
		report("keyorder", "publish (SendBatch, Ordered, 1,000 keys, heads)", r.koPub)
		report("keyorder", "consume Ordered, 1,000 keys", r.ko1000)
	}
	if run("keys") {
		_, r.ko10 = median(c, func() (float64, float64, error) { return benchKeyorder(ctx, pool, c, "ordered", 10, c.n) })
		report("keyorder", "consume Ordered, 10 keys", r.ko10)
		_, r.ko10k = median(c, func() (float64, float64, error) { return benchKeyorder(ctx, pool, c, "ordered", 10000, c.n) })
		report("keyorder", "consume Ordered, 10,000 keys", r.ko10k)
	}
	if run("backlog") && c.backlogBig > 0 {
		_, r.backSmall = median(c, func() (float64, float64, error) { return benchKeyorder(ctx, pool, c, "ordered", 1000, 10000) })
		report("keyorder", "consume Ordered, 1,000 keys, 10,000 waiting", r.backSmall)
		_, r.backBig = median(c, func() (float64, float64, error) { return benchKeyorder(ctx, pool, c, "ordered", 1000, c.backlogBig) })
		report("keyorder", fmt.Sprintf("consume Ordered, 1,000 keys, %d waiting", c.backlogBig), r.backBig)
	}
	if run("latency") {
		p50, p99, err := benchLatency(ctx, pool, c)
		if err != nil {
			log.Fatal(err)
		}
		r.p50, r.p99 = p50, p99
		fmt.Printf("%-14s %-46s p50 %v  p99 %v\n", "keyorder", "idle publish→handler latency (NOTIFY)", p50, p99)
	}
	if run("retention") && c.retention > 0 {
		if err := benchRetention(ctx, pool, c); err != nil {
			log.Fatal(err)
		}
	}
	r.print()
}

func withPoolSize(url string, n int) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return fmt.Sprintf("%s%spool_max_conns=%d", url, sep, n)
}

// median runs f c.rounds times and returns the median of each of its two
// rates.
func median(c config, f func() (float64, float64, error)) (float64, float64) {
	var as, bs []float64
	for range max(c.rounds, 1) {
		a, b, err := f()
		if err != nil {
			log.Fatal(err)
		}
		as, bs = append(as, a), append(bs, b)
	}
	slices.Sort(as)
	slices.Sort(bs)
	return as[len(as)/2], bs[len(bs)/2]
}

func report(system, what string, rate float64) {
	fmt.Printf("%-14s %-46s %10.0f msgs/s\n", system, what, rate)
}

type results struct {
	riverPub, riverCon, wmPub, wmCon  float64
	koPub, koPar, ko10, ko1000, ko10k float64
	backSmall, backBig                float64
	p50, p99                          time.Duration
}

func (r results) print() {
	fmt.Println("\nratios (goal in brackets):")
	ratio := func(what string, a, b float64, goal string) {
		if a == 0 || b == 0 {
			return
		}
		fmt.Printf("  %-58s %6.2f  [%s]\n", what, a/b, goal)
	}
	ratio("Ordered 1,000 keys / River work", r.ko1000, r.riverCon, "≥ 5")
	ratio("Ordered 1,000 keys / watermill-sql consume", r.ko1000, r.wmCon, "≥ 3")
	ratio("Ordered 10 keys / River work", r.ko10, r.riverCon, "≥ 2")
	ratio("Ordered 10,000 keys / Ordered 1,000 keys", r.ko10k, r.ko1000, "≥ 0.7")
	ratio("backlog 200,000 / backlog 10,000 (Ordered, 1,000 keys)", r.backBig, r.backSmall, "≥ 0.8")
	ratio("keyorder publish / River InsertMany", r.koPub, r.riverPub, "≥ 2")
	ratio("Parallel / River work", r.koPar, r.riverCon, "")
	ratio("keyorder publish / watermill-sql publish", r.koPub, r.wmPub, "")
	if r.p50 > 0 {
		fmt.Printf("  %-58s p50 %v p99 %v  [p50 ≤ 10ms, p99 ≤ 50ms]\n", "idle latency", r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond))
	}
}
