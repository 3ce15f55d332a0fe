package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// koEnv holds the drivers the benchmark drives directly (it measures the
// PostgreSQL queue, not the portable layer). Drivers are reached the way
// any driver-level tool reaches them, through the URL mux: the typed
// constructors return the portable types.
type koEnv struct {
	pool   *pgxpool.Pool
	schema string
	topic  driver.Topic
	subs   []driver.Subscription
}

func newKoEnv(ctx context.Context, pool *pgxpool.Pool, c config, ordering string, consumers int) (*koEnv, error) {
	ord, err := policy.ParseOrdering(ordering)
	if err != nil {
		return nil, err
	}
	e := &koEnv{pool: pool, schema: fmt.Sprintf("kobench_%d", time.Now().UnixNano()%1e9)}
	if _, err := postgres.Migrate(ctx, pool, postgres.DirectionUp, &postgres.MigrateOptions{Schema: e.schema}); err != nil {
		return nil, err
	}
	u, err := url.Parse(withPoolSize(c.url, 4))
	if err != nil {
		return nil, err
	}
	q := u.Query()
	q.Set("schema", e.schema)
	q.Set("create", "true")
	q.Set("max_batch", strconv.Itoa(c.recvBatch))
	q.Set("ordering", ord.String())
	q.Set("topic", "bench")
	u.RawQuery = q.Encode()
	if e.topic, err = driver.DefaultMux().OpenTopic(ctx, u.String()); err != nil {
		return nil, err
	}
	q.Set("subscription", "bench")
	u.RawQuery = q.Encode()
	for range consumers {
		s, err := driver.DefaultMux().OpenSubscription(ctx, u.String())
		if err != nil {
			return nil, err
		}
		e.subs = append(e.subs, s)
	}
	return e, nil
}

func (e *koEnv) close(ctx context.Context) {
	for _, s := range e.subs {
		s.Close()
	}
	e.topic.Close()
	_, _ = e.pool.Exec(ctx, "DROP SCHEMA "+e.schema+" CASCADE")
}

// publish sends n messages over keys keys (message i has key i%keys) in
// batches; the payload starts with the message's sequence number in its key.
func (e *koEnv) publish(ctx context.Context, c config, keys, n int) (float64, error) {
	payload := make([]byte, c.size)
	start := time.Now()
	for i := 0; i < n; {
		batch := make([]*driver.Message, 0, c.batch)
		for ; i < n && len(batch) < c.batch; i++ {
			p := slices.Clone(payload)
			binary.BigEndian.PutUint64(p, uint64(i/keys))
			batch = append(batch, &driver.Message{ID: strconv.Itoa(i), Key: "key-" + strconv.Itoa(i%keys), Payload: p})
		}
		if err := e.topic.SendBatch(ctx, batch); err != nil {
			return 0, err
		}
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// consume receives and acks n messages with every subscription in parallel,
// checking that each key's messages come in publish order.
func (e *koEnv) consume(ctx context.Context, c config, n int, ordered bool) (float64, error) {
	var done, finished atomic.Int64
	var mu sync.Mutex
	last := map[string]int64{}
	var violations atomic.Int64
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, len(e.subs))
	for _, s := range e.subs {
		wg.Go(func() {
			for done.Load() < int64(n) {
				rctx, rcancel := context.WithTimeout(ctx, 200*time.Millisecond)
				ms, err := s.Receive(rctx, c.recvBatch)
				rcancel()
				if err != nil {
					if ctx.Err() != nil {
						errs <- fmt.Errorf("consume: %d of %d after %v: %w", done.Load(), n, time.Since(start), ctx.Err())
						return
					}
					continue
				}
				if ordered {
					mu.Lock()
					for _, m := range ms {
						seq := int64(binary.BigEndian.Uint64(m.Payload))
						if prev, ok := last[m.Key]; ok && seq != prev+1 {
							violations.Add(1)
						}
						last[m.Key] = seq
					}
					mu.Unlock()
				}
				if r, ok := s.(driver.StartRecorder); ok {
					// The no-op handlers start: tell the driver, one call
					// per key's chain, as subscribe does (it records
					// asynchronously; a lost lease counts only started
					// messages).
					for i := 0; i < len(ms); {
						j := i + 1
						for j < len(ms) && ms[j].Key == ms[i].Key && ms[i].Key != "" {
							j++
						}
						if err := r.Started(ctx, ms[i:j]); err != nil {
							errs <- err
							return
						}
						i = j
					}
				}
				if err := s.Ack(ctx, ms); err != nil {
					errs <- err
					return
				}
				if done.Add(int64(len(ms))) >= int64(n) {
					finished.CompareAndSwap(0, time.Now().UnixNano())
				}
			}
		})
	}
	wg.Wait()
	// Stop the clock when the last message was acked, not when the other
	// consumers' Receive calls time out.
	el := time.Unix(0, finished.Load()).Sub(start)
	close(errs)
	for err := range errs {
		return 0, err
	}
	if v := violations.Load(); v > 0 {
		return 0, fmt.Errorf("consume: %d order violations", v)
	}
	return float64(n) / el.Seconds(), nil
}

func benchKeyorder(ctx context.Context, pool *pgxpool.Pool, c config, ordering string, keys, n int) (pub, con float64, err error) {
	e, err := newKoEnv(ctx, pool, c, ordering, c.consumers)
	if err != nil {
		return 0, 0, err
	}
	defer e.close(ctx)
	what := fmt.Sprintf("%s, %d keys, %d", ordering, keys, n)
	cpu := c.srv.start()
	if pub, err = e.publish(ctx, c, keys, n); err != nil {
		return 0, 0, err
	}
	cpu.report("keyorder", "publish "+what, n)
	cpu = c.srv.start()
	con, err = e.consume(ctx, c, n, ordering == "ordered")
	cpu.report("keyorder", "consume "+what, n)
	return pub, con, err
}

// benchLatency publishes single messages to an idle Ordered subscription and
// measures the time to the consumer's Receive returning them.
func benchLatency(ctx context.Context, pool *pgxpool.Pool, c config) (p50, p99 time.Duration, err error) {
	e, err := newKoEnv(ctx, pool, c, "ordered", 1)
	if err != nil {
		return 0, 0, err
	}
	defer e.close(ctx)
	const warm, n = 10, 300
	lat := make(chan time.Duration, n)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		s := e.subs[0]
		for {
			ms, err := s.Receive(cctx, 10)
			if err != nil {
				return
			}
			now := time.Now()
			for _, m := range ms {
				lat <- now.Sub(time.Unix(0, int64(binary.BigEndian.Uint64(m.Payload))))
			}
			_ = s.Ack(cctx, ms)
		}
	}()
	var ds []time.Duration
	for i := range n {
		p := make([]byte, c.size)
		binary.BigEndian.PutUint64(p, uint64(time.Now().UnixNano()))
		if err := e.topic.SendBatch(ctx, []*driver.Message{{ID: strconv.Itoa(i), Key: "k" + strconv.Itoa(i%10), Payload: p}}); err != nil {
			return 0, 0, err
		}
		select {
		case d := <-lat:
			if i >= warm {
				ds = append(ds, d)
			}
		case <-time.After(5 * time.Second):
			return 0, 0, fmt.Errorf("latency: message %d not received in 5s", i)
		}
		time.Sleep(10 * time.Millisecond) // idle between messages: this is the idle-latency test
	}
	slices.Sort(ds)
	return ds[len(ds)/2], ds[len(ds)*99/100], nil
}

// benchRetention publishes and consumes at a steady rate for c.retention and
// prints the tables' sizes as it goes: acked rows are deleted, so the sizes
// level off instead of growing with the number of messages.
func benchRetention(ctx context.Context, pool *pgxpool.Pool, c config) error {
	e, err := newKoEnv(ctx, pool, c, "ordered", c.consumers)
	if err != nil {
		return err
	}
	defer e.close(ctx)
	const rate = 10000 // msgs/s
	cctx, cancel := context.WithTimeout(ctx, c.retention)
	defer cancel()
	var published, consumed atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		i := 0
		for {
			select {
			case <-cctx.Done():
				return
			case <-tick.C:
			}
			batch := make([]*driver.Message, rate/20)
			for j := range batch {
				p := make([]byte, c.size)
				binary.BigEndian.PutUint64(p, uint64(i/1000))
				batch[j] = &driver.Message{ID: strconv.Itoa(i), Key: "key-" + strconv.Itoa(i%1000), Payload: p}
				i++
			}
			if err := e.topic.SendBatch(cctx, batch); err != nil {
				return
			}
			published.Add(int64(len(batch)))
		}
	})
	for _, s := range e.subs {
		wg.Go(func() {
			for cctx.Err() == nil {
				ms, err := s.Receive(cctx, c.recvBatch)
				if err != nil {
					continue
				}
				if err := s.Ack(context.WithoutCancel(cctx), ms); err == nil {
					consumed.Add(int64(len(ms)))
				}
			}
		})
	}
	fmt.Printf("\nretention: Ordered, 1,000 keys, publishing %d msgs/s for %v while consuming\n", rate, c.retention)
	fmt.Printf("  %6s %10s %10s %9s %12s %14s %10s\n", "t", "published", "consumed", "backlog", "messages MB", "deliveries MB", "heads MB")
	size := func(t string) float64 {
		var b int64
		_ = pool.QueryRow(ctx, "SELECT pg_total_relation_size($1)", e.schema+"."+t).Scan(&b)
		return float64(b) / (1 << 20)
	}
	start := time.Now()
	tick := time.NewTicker(c.retention / 6)
	defer tick.Stop()
	for cctx.Err() == nil {
		select {
		case <-cctx.Done():
		case <-tick.C:
			p, co := published.Load(), consumed.Load()
			fmt.Printf("  %6s %10d %10d %9d %12.1f %14.1f %10.2f\n", time.Since(start).Round(time.Second), p, co, p-co,
				size("messages"), size("deliveries"), size("heads"))
		}
	}
	wg.Wait()
	return nil
}
