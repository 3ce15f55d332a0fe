// The compaction benchmark (-backend pgcompact): 1,000 keys each updated
// 100 times on an Exclusive PostgreSQL subscription, with compaction off
// and on. Two workloads:
//
//   - backlog: every update is published first, then the consumers start;
//   - live: the consumers run while the updates are published (each key's
//     versions in order, spread over the run).
//
// Reported per run: messages handled, messages superseded, wall time until
// every key's newest version was handled, and the rate that matters to a
// handler applying a key's latest state: keys brought to their latest
// state per second.

package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"log"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/driver"
)

const (
	compactKeys     = 1000
	compactVersions = 100
)

type compactResult struct {
	workload   string
	compact    bool
	handled    int64
	superseded int64
	publish    time.Duration
	wall       time.Duration
}

func pgCompact(ctx context.Context, c config, out string) {
	if c.url == "" {
		log.Fatal("bench: no -url and no KEYORDER_PG_URL")
	}
	pool, err := pgxpool.New(ctx, withPoolSize(c.url, 20))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	var version string
	_ = pool.QueryRow(ctx, "SHOW server_version").Scan(&version)
	var rs []compactResult
	for _, wl := range []string{"backlog", "live"} {
		for _, on := range []bool{false, true} {
			r, err := compactRun(ctx, pool, c, wl, on)
			if err != nil {
				log.Fatalf("bench: pgcompact %s compact=%v: %v", wl, on, err)
			}
			log.Printf("bench: pgcompact %s compact=%v: %d handled, %d superseded, %v", wl, on, r.handled, r.superseded, r.wall)
			rs = append(rs, r)
		}
	}
	load, _ := os.ReadFile("/proc/loadavg")
	var b strings.Builder
	fmt.Fprintf(&b, "# PostgreSQL compaction\n\n")
	fmt.Fprintf(&b, "%s UTC. ", time.Now().UTC().Format("2006-01-02 15:04"))
	fmt.Fprintf(&b, "%d keys × %d updates each (%d messages of %d bytes), Exclusive subscription, %d consumers "+
		"(each its own Subscription, Receive of up to %d), publish batches of %d. PostgreSQL %s, %d CPUs, "+
		"load average at the end %s. `go run ./integration/cmd/testenv run --only postgres -- go run ./integration/bench -backend pgcompact -out integration/bench/results`\n\n",
		compactKeys, compactVersions, compactKeys*compactVersions, c.size, c.consumers, c.recvBatch, c.batch,
		version, runtime.NumCPU(), strings.TrimSpace(string(load)))
	b.WriteString("backlog: everything published, then consumed; live: consumed while published. " +
		"Wall time: from the start of consuming (backlog) or publishing (live) until every key's newest update was handled.\n\n")
	b.WriteString("| workload | compaction | handled | superseded | publish | wall time | keys at latest state/s | handled msgs/s |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rs {
		on := "off"
		if r.compact {
			on = "on"
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %.2fs | %.2fs | %.0f | %.0f |\n", r.workload, on, r.handled, r.superseded,
			r.publish.Seconds(), r.wall.Seconds(), compactKeys/r.wall.Seconds(), float64(r.handled)/r.wall.Seconds())
	}
	fmt.Print(b.String())
	if out != "" {
		if err := os.WriteFile(filepath.Join(out, "pgcompact.md"), []byte(b.String()), 0o644); err != nil {
			log.Fatal(err)
		}
	}
}

func compactRun(ctx context.Context, pool *pgxpool.Pool, c config, workload string, compact bool) (compactResult, error) {
	r := compactResult{workload: workload, compact: compact}
	schema := fmt.Sprintf("kocompact_%d", time.Now().UnixNano()%1e9)
	if _, err := postgres.Migrate(ctx, pool, postgres.DirectionUp, &postgres.MigrateOptions{Schema: schema}); err != nil {
		return r, err
	}
	defer pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+schema+" CASCADE")
	u, err := url.Parse(withPoolSize(c.url, 4))
	if err != nil {
		return r, err
	}
	q := u.Query()
	q.Set("schema", schema)
	q.Set("create", "true")
	q.Set("max_batch", strconv.Itoa(c.recvBatch))
	q.Set("ordering", "exclusive")
	q.Set("compact", strconv.FormatBool(compact))
	q.Set("topic", "bench")
	u.RawQuery = q.Encode()
	topic, err := driver.DefaultMux().OpenTopic(ctx, u.String())
	if err != nil {
		return r, err
	}
	defer topic.Close()
	q.Set("subscription", "bench")
	u.RawQuery = q.Encode()
	var subs []driver.Subscription
	for range c.consumers {
		s, err := driver.DefaultMux().OpenSubscription(ctx, u.String())
		if err != nil {
			return r, err
		}
		defer s.Close()
		subs = append(subs, s)
	}
	publish := func() error {
		start := time.Now()
		defer func() { r.publish = time.Since(start) }()
		payload := make([]byte, max(c.size, 8))
		n := compactKeys * compactVersions
		for i := 0; i < n; {
			batch := make([]*driver.Message, 0, c.batch)
			for ; i < n && len(batch) < c.batch; i++ {
				p := append([]byte(nil), payload...)
				binary.BigEndian.PutUint64(p, uint64(i/compactKeys+1)) // version 1..100
				batch = append(batch, &driver.Message{ID: strconv.Itoa(i), Key: "key-" + strconv.Itoa(i%compactKeys), Payload: p})
			}
			if err := topic.SendBatch(ctx, batch); err != nil {
				return err
			}
		}
		return nil
	}
	if workload == "backlog" {
		if err := publish(); err != nil {
			return r, err
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var mu sync.Mutex
	latest := map[string]uint64{}
	var handled, violations atomic.Int64
	atLatest := make(chan struct{})
	var once sync.Once
	start := time.Now()
	var pubErr error
	var pw sync.WaitGroup
	if workload == "live" {
		pw.Go(func() { pubErr = publish() })
	}
	var wg sync.WaitGroup
	for _, s := range subs {
		wg.Go(func() {
			for {
				select {
				case <-atLatest:
					return
				default:
				}
				rctx, rcancel := context.WithTimeout(cctx, 200*time.Millisecond)
				ms, err := s.Receive(rctx, c.recvBatch)
				rcancel()
				if err != nil {
					if cctx.Err() != nil {
						return
					}
					continue
				}
				mu.Lock()
				for _, m := range ms {
					v := binary.BigEndian.Uint64(m.Payload)
					if v <= latest[m.Key] {
						violations.Add(1)
					}
					latest[m.Key] = max(latest[m.Key], v)
				}
				done := len(latest) == compactKeys
				if done {
					for _, v := range latest {
						if v != compactVersions {
							done = false
							break
						}
					}
				}
				mu.Unlock()
				if err := s.Ack(cctx, ms); err != nil {
					log.Printf("bench: ack: %v", err)
					return
				}
				handled.Add(int64(len(ms)))
				if done {
					once.Do(func() { r.wall = time.Since(start); close(atLatest) })
				}
			}
		})
	}
	wg.Wait()
	pw.Wait()
	if pubErr != nil {
		return r, pubErr
	}
	if r.wall == 0 {
		return r, fmt.Errorf("not every key reached its latest version: %v", cctx.Err())
	}
	if v := violations.Load(); v > 0 {
		return r, fmt.Errorf("%d deliveries of a version not newer than one already handled", v)
	}
	r.handled = handled.Load()
	st, err := subs[0].(driver.StatsReporter).BackendStats(ctx)
	if err != nil {
		return r, err
	}
	r.superseded = st.Superseded
	if r.handled+r.superseded != compactKeys*compactVersions {
		return r, fmt.Errorf("handled %d + superseded %d != published %d", r.handled, r.superseded, compactKeys*compactVersions)
	}
	return r, nil
}
