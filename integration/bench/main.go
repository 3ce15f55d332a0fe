// Command bench runs, side by side in one run per backend, each broker's raw
// client and keyorder on the same workload, and prints msgs/s, ratios and
// per-key order violations for both.
//
// It is a module of its own so that users of keyorder never inherit the
// raw clients' (River's, Watermill's) dependencies.
//
//	go run ./integration/cmd/testenv run --only postgres -- go run ./integration/bench -backend postgres
//	go run ./integration/bench -backend memory -quick
//
// Workload: -n messages of -size bytes over each of -keys key counts;
// message i has key i%keys, and its payload carries its key and per-key
// sequence number. Each system, on a fresh topic/queue each time:
//
//   - publish: sends every message (each key's in order) and waits until
//     the broker has confirmed them all;
//   - consume: receives and acknowledges that backlog with a no-op handler;
//   - end-to-end: on a fresh topic, publishes and consumes at once, timed
//     from the first publish to the last message handled.
//
// Consumers count per-key order violations (a message handled after a
// later message of its key) and duplicates (a message handled again).
// keyorder runs its portable layer (publish.Publisher, subscribe.Subscriber
// under policy.Ordered with keyed lanes) in two publishing modes: Publish
// from one goroutine per key, and PublishBatch from a few goroutines each
// owning a share of the keys. The raw clients, per backend:
//
//   - memory: a buffered Go channel, one producer, several consumers;
//   - postgres: pgx on a plain table (COPY, then DELETE … FOR UPDATE SKIP
//     LOCKED RETURNING by several consumers), and River and watermill-sql;
//   - pubsub: the Pub/Sub v2 client, a publisher with ordering keys and a
//     subscriber with message ordering enabled;
//   - sqs: aws-sdk-go-v2 on a FIFO queue, SendMessageBatch of one group's
//     messages per call, ReceiveMessage and DeleteMessageBatch;
//   - pulsar: pulsar-client-go, SendAsync with key-based batching and a
//     Key_Shared consumer.
//
// Output: a Markdown table per backend on stdout and, with -out, in
// DIR/<backend>.md with a chart in DIR/<backend>.png. -backend pgsuite runs
// the PostgreSQL-only suite instead (keyorder's driver against River and
// watermill-sql, key counts, backlog, idle latency, retention); -backend
// pgbatch the ordered-batch benchmark (a hot key, batches of 1, 10, 100);
// -backend pgtx the cost of postgres.HandleTx against the plain ack.
//
// Documentation: -docs docs/benchmarks.md writes the benchmarks page from
// the tables in -results (default integration/bench/results), each under
// the command that produced it and its date; it runs no benchmark.
//
// Diagnostics: -rpcs prints, after each backlog publish, the publish
// requests the broker received and their sizes (pubsub: a gRPC
// interceptor; pulsar: the client's metrics) and, on sqs, after each
// backlog consume, the consume-side calls per API (calls per message,
// messages or entries per call, round-trip times, releases and
// extensions; for ReceiveMessage also the calls over 100 ms and the
// messages and groups in flight when each call was made); -publish-only skips the consume and end-to-end phases;
// -alternate runs the systems' rounds in turn; $KEYORDER_BENCH_CPUPROFILE
// names a file for a CPU profile of the run; $KEYORDER_BENCH_SERVER_PID
// names the broker's process, whose CPU time per message consumed is then
// printed after each backlog consume; -raw-attrs (sqs) adds a raw system
// sending and receiving the message attributes keyorder sends, and
// -raw-ko-receive one that also receives with the ReceiveMessage
// parameters keyorder's driver sends (an attempt ID, six system attribute
// names, a visibility timeout).
//
// Servers come from the environment testenv sets: KEYORDER_PG_URL,
// PUBSUB_EMULATOR_HOST, KEYORDER_SQS_ENDPOINT, KEYORDER_PULSAR_URL.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"
)

// options are the side-by-side runs' settings.
// handlerWork (-work) is the handler time per message, koWorkers
// (-workers) overrides keyorder's Workers and koAssign (-assign) its lane
// assignment; set once from the flags.
var (
	handlerWork time.Duration
	koWorkers   int
	koAssign    string
)

type options struct {
	n       int
	keys    []int
	size    int
	rounds  int
	timeout time.Duration
	out     string
	// only, when set, names the systems to run (substrings of their names).
	only []string
	// quick is the short mode: fewer messages, one key count.
	quick bool
}

// quickened returns o in the short mode: 2,000 messages over 200 keys, no
// warm-up, phases bounded by 2 minutes.
func (o options) quickened() options {
	o.quick = true
	o.n, o.keys, o.rounds = 2000, []int{200}, 1
	o.timeout = min(cmp.Or(o.timeout, 2*time.Minute), 2*time.Minute)
	return o
}

// backends lists the -backend values in the order "all" runs them.
var backends = []string{"memory", "postgres", "pubsub", "sqs", "pulsar", "kafka", "nats"}

func main() {
	var (
		o      options
		which  string
		keys   string
		only   string
		c      config
		docs   string
		resDir string
	)
	flag.StringVar(&which, "backend", "memory", "memory|postgres|pubsub|sqs|pulsar|kafka|nats|all, pgsuite for the PostgreSQL-only suite, pgbatch for ordered batches on a hot PostgreSQL key, pgtx for HandleTx against the plain ack, pgcompact for PostgreSQL compaction, or fairness")
	flag.IntVar(&o.n, "n", 20000, "messages per run")
	flag.StringVar(&keys, "keys", "200,1000", "comma-separated key counts")
	flag.IntVar(&o.size, "size", 100, "payload bytes")
	flag.IntVar(&o.rounds, "rounds", 1, "runs of each measurement; medians are reported")
	flag.DurationVar(&o.timeout, "timeout", 10*time.Minute, "give up one phase of one system after this long")
	flag.StringVar(&o.out, "out", "", "directory for <backend>.md and <backend>.png (empty: stdout only)")
	flag.StringVar(&only, "only", "", "comma-separated substrings of the systems to run (e.g. raw,PublishBatch); pgsuite: river,watermill,keyorder,keys,backlog,latency,retention")
	flag.BoolVar(&o.quick, "quick", false, "short mode: 2,000 messages, 200 keys")
	flag.DurationVar(&handlerWork, "work", 0, "kafka, nats: handler time per message on both sides (keyorder's handler; the raw Kafka consumer then runs one goroutine per partition, franz-go's own example shape; the raw NATS consumer sleeps in its callback)")
	flag.IntVar(&koWorkers, "workers", 0, "keyorder's subscribe Workers (0: each backend's setting)")
	flag.StringVar(&koAssign, "assign", "", "keyorder's subscribe Assign: bykey or shared (empty: the subscriber's default)")
	flag.StringVar(&docs, "docs", "", "write this file (docs/benchmarks.md) from the tables in -results and exit; runs no benchmark")
	flag.StringVar(&resDir, "results", "integration/bench/results", "-docs: the directory of the results tables")
	// The PostgreSQL suite's own settings.
	flag.StringVar(&c.url, "url", os.Getenv("KEYORDER_PG_URL"), "pgsuite: PostgreSQL URL (default $KEYORDER_PG_URL)")
	flag.IntVar(&c.batch, "batch", 1000, "pgsuite: publish batch size")
	flag.IntVar(&c.consumers, "consumers", 4, "pgsuite: keyorder consumer goroutines (each its own Subscription)")
	flag.IntVar(&c.recvBatch, "recv", 1000, "pgsuite: keyorder messages per Receive")
	flag.DurationVar(&c.retention, "retention", 60*time.Second, "pgsuite: duration of the retention run (0: skip)")
	flag.IntVar(&c.backlogBig, "backlog", 200000, "pgsuite: large backlog for the flatness test (0: skip)")
	// The fairness benchmark's own settings (fairness.go).
	fo := fairOptions{}
	flag.IntVar(&fo.perSmall, "fair-small", 200, "fairness: messages per small tenant (the big one publishes 100x)")
	flag.IntVar(&fo.bursts, "fair-bursts", 20, "fairness: bursts of the big tenant")
	flag.DurationVar(&fo.work, "fair-work", 2*time.Millisecond, "fairness: handler time in the latency run")
	flag.IntVar(&fo.window, "fair-window", 4096, "fairness: subscribe MaxOutstanding")
	flag.IntVar(&fo.workers, "fair-workers", 8, "fairness: subscribe Workers")
	flag.IntVar(&fo.tpN, "fair-n", 100000, "fairness: messages of the no-op throughput run")
	flag.StringVar(&fo.backend, "fair-backend", "memory", "fairness: memory, or postgres (under testenv)")
	flag.StringVar(&fo.only, "fair-only", "", "fairness: run only \"arrival\" or \"fair\" (to profile one)")
	flag.Parse()
	if docs != "" {
		if err := writeDocs(docs, resDir); err != nil {
			log.Fatalf("bench: -docs: %v", err)
		}
		return
	}
	ctx := context.Background()
	if which == "pgcompact" {
		c.size = o.size
		pgCompact(ctx, c, o.out)
		return
	}
	if which == "pgtx" {
		o.keys = nil
		for _, s := range strings.Split(keys, ",") {
			if k, err := strconv.Atoi(strings.TrimSpace(s)); err == nil && k > 0 {
				o.keys = append(o.keys, k)
			}
		}
		if err := pgTxBench(ctx, o); err != nil {
			log.Fatalf("bench: pgtx: %v", err)
		}
		return
	}
	if which == "pgbatch" {
		if err := pgBatchBench(ctx, o); err != nil {
			log.Fatalf("bench: pgbatch: %v", err)
		}
		return
	}
	if which == "fairness" {
		fo.rounds, fo.out = max(o.rounds, 1), o.out
		fairnessMain(ctx, fo)
		return
	}
	if which == "pgsuite" {
		c.n, c.size, c.rounds, c.only = o.n, o.size, max(o.rounds, 1), only
		pgSuite(ctx, c)
		return
	}
	for _, s := range strings.Split(keys, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || k <= 0 {
			log.Fatalf("bench: bad -keys %q", keys)
		}
		o.keys = append(o.keys, k)
	}
	if only != "" {
		o.only = strings.Split(only, ",")
	}
	if o.quick {
		o = o.quickened()
	}
	if handlerWork > 0 && which != "kafka" && which != "nats" {
		log.Fatalf("bench: -work is implemented for -backend kafka and nats only (the other raw sides would run without it)")
	}
	names := []string{which}
	if which == "all" {
		names = backends
	}
	defer startCPUProfile()()
	failed := false
	for _, name := range names {
		if _, err := runBackend(ctx, name, o, os.Stdout); err != nil {
			log.Printf("bench: %s: %v", name, err)
			failed = true
		}
	}
	if failed {
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// runBackend measures every system of one backend and writes its report.
// It fails when keyorder broke per-key order.
func runBackend(ctx context.Context, name string, o options, stdout io.Writer) (*report, error) {
	b, err := openBackend(ctx, name)
	if err != nil {
		return nil, err
	}
	defer b.close()
	rep := &report{backend: b, o: o, started: time.Now()}
	fmt.Fprintf(stdout, "bench: %s, %d messages of %d B, keys %v, %d round(s)\n", b.title, o.n, o.size, o.keys, max(o.rounds, 1))
	// Warm every system up (connections, the broker's JIT) on a small
	// workload first, so that the one measured first is not penalised.
	// The quick mode only checks that everything runs.
	warm := newWorkload(min(o.n, 500), min(o.keys[0], 50), o.size)
	wo := o
	wo.rounds = 1
	for _, sys := range b.systems {
		if selected(sys.name, o.only) && !o.quick {
			if _, _, _, _, err := backlogRun(ctx, b, sys, warm, wo); err != nil {
				return nil, fmt.Errorf("warm-up: %w", err)
			}
		}
	}
	for _, k := range o.keys {
		w := newWorkload(o.n, k, o.size)
		var sel []system
		for _, sys := range b.systems {
			if selected(sys.name, o.only) {
				sel = append(sel, sys)
			}
		}
		results, err := measureAll(ctx, b, sel, w, o)
		if err != nil {
			return nil, err
		}
		for i, sys := range sel {
			res := results[i]
			fmt.Fprintf(stdout, "  %5d keys  %-33s publish %9.0f  consume %9.0f  e2e %9.0f msgs/s  violations %d  dups %d  (load %.2f)\n",
				k, sys.name, res.publish, res.consume, res.e2e, res.violations, res.dups, res.load)
			rep.results = append(rep.results, res)
		}
	}
	fmt.Fprintln(stdout)
	md := rep.markdown()
	fmt.Fprintln(stdout, md)
	if o.out != "" {
		if err := os.MkdirAll(o.out, 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(o.out, name+".md"), []byte(md), 0o644); err != nil {
			return nil, err
		}
		if err := rep.chart(filepath.Join(o.out, name+".png")); err != nil {
			return nil, fmt.Errorf("chart: %w", err)
		}
	}
	return rep, rep.check()
}

func selected(name string, only []string) bool {
	if len(only) == 0 {
		return true
	}
	for _, s := range only {
		if s != "" && strings.Contains(name, s) {
			return true
		}
	}
	return false
}

// openBackend connects to the backend's server (from the environment
// testenv sets) and returns its systems, the raw client first.
func openBackend(ctx context.Context, name string) (*backend, error) {
	switch name {
	case "memory":
		return memoryBackend(ctx)
	case "postgres":
		return postgresBackend(ctx)
	case "pubsub":
		return pubsubBackend(ctx)
	case "sqs":
		return sqsBackend(ctx)
	case "pulsar":
		return pulsarBackend(ctx)
	case "kafka":
		return kafkaBackend(ctx)
	case "nats":
		return natsBackend(ctx)
	}
	return nil, fmt.Errorf("unknown backend %q (want memory, postgres, pubsub, sqs, pulsar, kafka, nats, all or pgsuite)", name)
}

// env returns the environment variable's value, or an error naming it.
func env(name, backend string) (string, error) {
	v := os.Getenv(name)
	if v == "" {
		return "", fmt.Errorf("%s is not set: run under `go run ./integration/cmd/testenv run --only %s -- ...`", name, backend)
	}
	return v, nil
}

// startCPUProfile starts a CPU profile of the whole run when
// $KEYORDER_BENCH_CPUPROFILE names a file, and returns what stops it.
func startCPUProfile() (stop func()) {
	path := os.Getenv("KEYORDER_BENCH_CPUPROFILE")
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		log.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		log.Fatal(err)
	}
	return pprof.StopCPUProfile
}
