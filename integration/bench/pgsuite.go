// The PostgreSQL suite (-backend pgsuite) compares keyorder's native
// PostgreSQL queue with River and watermill-sql on one PostgreSQL server,
// side by side in one run, and prints msgs/s and ratios.
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
	"fmt"
	"log"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// config is the PostgreSQL suite's configuration (-backend pgsuite).
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
	srv        serverCPU // set by pgSuite
}

// pgSuite runs the PostgreSQL suite: keyorder's driver against River and
// watermill-sql, the key-count and backlog tests, idle latency and
// retention.
func pgSuite(ctx context.Context, c config) {
	if c.url == "" {
		log.Fatal("bench: no -url and no KEYORDER_PG_URL")
	}
	pool, err := pgxpool.New(ctx, withPoolSize(c.url, 20))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	c.srv = newServerCPU(ctx, pool)
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
		pgReport("river", "insert (InsertMany)", r.riverPub)
		pgReport("river", "work (no-op, FetchCooldown 1ms)", r.riverCon)
	}
	if run("watermill") {
		r.wmPub, r.wmCon = median(c, func() (float64, float64, error) { return benchWatermill(ctx, pool, c) })
		pgReport("watermill-sql", "publish (batched)", r.wmPub)
		pgReport("watermill-sql", "consume", r.wmCon)
	}
	if run("keyorder") {
		_, r.koPar = median(c, func() (float64, float64, error) { return benchKeyorder(ctx, pool, c, "parallel", 1000, c.n) })
		pgReport("keyorder", "consume Parallel", r.koPar)
		r.koPub, r.ko1000 = median(c, func() (float64, float64, error) { return benchKeyorder(ctx, pool, c, "ordered", 1000, c.n) })
		pgReport("keyorder", "publish (SendBatch, Ordered, 1,000 keys, heads)", r.koPub)
		pgReport("keyorder", "consume Ordered, 1,000 keys", r.ko1000)
	}
	if run("keys") {
		_, r.ko10 = median(c, func() (float64, float64, error) { return benchKeyorder(ctx, pool, c, "ordered", 10, c.n) })
		pgReport("keyorder", "consume Ordered, 10 keys", r.ko10)
		_, r.ko10k = median(c, func() (float64, float64, error) { return benchKeyorder(ctx, pool, c, "ordered", 10000, c.n) })
		pgReport("keyorder", "consume Ordered, 10,000 keys", r.ko10k)
	}
	if run("backlog") && c.backlogBig > 0 {
		_, r.backSmall = median(c, func() (float64, float64, error) { return benchKeyorder(ctx, pool, c, "ordered", 1000, 10000) })
		pgReport("keyorder", "consume Ordered, 1,000 keys, 10,000 waiting", r.backSmall)
		_, r.backBig = median(c, func() (float64, float64, error) { return benchKeyorder(ctx, pool, c, "ordered", 1000, c.backlogBig) })
		pgReport("keyorder", fmt.Sprintf("consume Ordered, 1,000 keys, %d waiting", c.backlogBig), r.backBig)
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

func pgReport(system, what string, rate float64) {
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
