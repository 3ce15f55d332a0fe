package kafka_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/kafka"
	"github.com/keyorder/keyorder/integration/proctest"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// The crash test runs consumers as real processes (proctest's helpers):
// the test binary re-executed as helper "consumer" runs helperConsumer
// instead of the tests, so a SIGKILL hits a group member holding
// partitions and records in flight, as a crash would.

func TestMain(m *testing.M) {
	proctest.Main(openCrashConsumer)
	proctest.Helpers(map[string]func() int{"consumer": helperConsumer})
	os.Exit(m.Run())
}

// helperConsumer consumes group KEYORDER_KAFKA_GROUP of topic
// KEYORDER_KAFKA_TOPIC through subscribe.Subscriber (Ordered, 4 workers)
// until killed. For each attempt it appends "start key seq attempt
// unixnano" and "end key seq attempt unixnano ok|fail" lines to
// KEYORDER_KAFKA_RECORDS (one write per line, so a kill leaves whole
// lines). A handler sleeps up to 3ms and fails one attempt in 20 (retried
// in process, holding its key).
func helperConsumer() int {
	ctx := context.Background()
	write, err := proctest.Records()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sub, err := kafka.OpenSubscription(ctx, os.Getenv("KEYORDER_KAFKA_TOPIC"), os.Getenv("KEYORDER_KAFKA_GROUP"), &kafka.SubscriptionOptions{
		Ordering: policy.Ordered, SessionTimeout: 6 * time.Second, CommitInterval: 100 * time.Millisecond,
		ClientOptions: []kgo.Opt{kgo.SeedBrokers(strings.Split(os.Getenv("KEYORDER_KAFKA_BROKERS"), ",")...)},
		Logger:        quiet,
	}, &subscribe.Config{Workers: 4, Logger: quiet, Retry: policy.Retry{MaxAttempts: 1000, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 2
	}
	err = sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
		key, seq, _ := strings.Cut(string(d.Payload), ":")
		write("start %s %s %d %d", key, seq, d.Attempt, time.Now().UnixNano())
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		if rand.IntN(20) == 0 {
			write("end %s %s %d %d fail", key, seq, d.Attempt, time.Now().UnixNano())
			return fmt.Errorf("injected failure of %s", d.Payload)
		}
		write("end %s %s %d %d ok", key, seq, d.Attempt, time.Now().UnixNano())
		return nil
	})
	fmt.Fprintln(os.Stderr, "run:", err)
	return 2
}

type helper struct{ *proctest.Proc }

func startHelper(t *testing.T, topic, group string) *helper {
	t.Helper()
	return &helper{proctest.Start(t, "consumer", "KEYORDER_KAFKA_TOPIC="+topic,
		"KEYORDER_KAFKA_GROUP="+group, "KEYORDER_KAFKA_BROKERS="+strings.Join(brokers(t), ","))}
}

func (h *helper) kill() { h.Kill() }

type record struct {
	start    bool
	key      string
	seq      int
	attempt  int
	at       int64
	ok       bool
	proc     int
	position int // in its process's file
}

func (h *helper) read(t *testing.T, proc int) []record {
	t.Helper()
	var out []record
	for _, fs := range h.Lines(t) {
		if len(fs) < 5 {
			continue
		}
		r := record{start: fs[0] == "start", key: fs[1], proc: proc, position: len(out)}
		r.seq, _ = strconv.Atoi(fs[2])
		r.attempt, _ = strconv.Atoi(fs[3])
		r.at, _ = strconv.ParseInt(fs[4], 10, 64)
		r.ok = len(fs) > 5 && fs[5] == "ok"
		out = append(out, r)
	}
	return out
}

var waitUntil = proctest.WaitUntil

// TestCrashAndRebalance: three consumer processes of one Ordered group on
// a 6-partition topic while records keep arriving; one is killed with
// SIGKILL mid-stream, a fourth joins (the group rebalances twice: the
// join revokes partitions of the survivors while they run records, the
// dead member's partitions move after its session times out). Checked
// from the handlers' records: every record completes (0 lost), no record
// starts before every earlier record of its key completed (0 order
// violations; redeliveries of completed records are allowed), and no key
// runs in two processes at once.
func TestCrashAndRebalance(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl := newClient(t)
	topic := createTopic(ctx, t, cl, 6)
	group := uniqueName("g")
	pub, err := kafka.OpenTopic(ctx, cl, topic, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(context.Background())
	const keys, perKey = 40, 60
	hs := []*helper{startHelper(t, topic, group), startHelper(t, topic, group), startHelper(t, topic, group)}
	all := func() []record {
		var rs []record
		for i, h := range hs {
			rs = append(rs, h.read(t, i)...)
		}
		return rs
	}
	completed := func() map[[2]string]bool {
		ok := map[[2]string]bool{}
		for _, r := range all() {
			if !r.start && r.ok {
				ok[[2]string{r.key, strconv.Itoa(r.seq)}] = true
			}
		}
		return ok
	}
	// Publish round by round (one record of each key per round) over
	// about six seconds, while the group churns.
	published := make(chan error, 1)
	go func() {
		for r := range perKey {
			batch := make([]*keyorder.Message, 0, keys)
			for k := range keys {
				batch = append(batch, &keyorder.Message{Key: "k" + strconv.Itoa(k), Payload: fmt.Appendf(nil, "k%d:%d", k, r)})
			}
			if _, err := pub.PublishBatch(ctx, batch); err != nil {
				published <- err
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		published <- nil
	}()
	victim := hs[1]
	waitUntil(t, 60*time.Second, "the victim to complete 100 records", func() bool {
		n := 0
		for _, r := range victim.read(t, 1) {
			if !r.start && r.ok {
				n++
			}
		}
		return n >= 100
	})
	victim.kill()
	killedAt := time.Now()
	t.Logf("killed process 1 at %d records completed in all", len(completed()))
	hs = append(hs, startHelper(t, topic, group))
	if err := <-published; err != nil {
		t.Fatalf("publish: %v", err)
	}
	waitUntil(t, 60*time.Second, "every record completed", func() bool { return len(completed()) == keys*perKey })
	t.Logf("all %d records completed %v after the kill", keys*perKey, time.Since(killedAt).Round(time.Millisecond))
	for _, h := range hs {
		h.kill()
	}
	rs := all()
	slices.SortStableFunc(rs, func(a, b record) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		if a.proc != b.proc {
			return a.proc - b.proc
		}
		return a.position - b.position
	})
	// Order: when seq n of a key starts, seqs 0..n-1 have completed.
	doneUpTo := map[string]int{} // key -> count of its leading seqs completed
	doneSet := map[string]map[int]bool{}
	violations, dup := 0, 0
	starts := 0
	for _, r := range rs {
		if r.start {
			starts++
			if r.seq > doneUpTo[r.key] {
				violations++
				if violations <= 5 {
					t.Errorf("key %s: seq %d started in process %d while seq %d had not completed", r.key, r.seq, r.proc, doneUpTo[r.key])
				}
			}
			if doneSet[r.key][r.seq] {
				dup++
			}
			continue
		}
		if !r.ok {
			continue
		}
		if doneSet[r.key] == nil {
			doneSet[r.key] = map[int]bool{}
		}
		doneSet[r.key][r.seq] = true
		for doneSet[r.key][doneUpTo[r.key]] {
			doneUpTo[r.key]++
		}
	}
	// Exclusivity: a key's attempts never overlap across processes.
	type span struct {
		start, end int64
		proc       int
	}
	open := map[string]record{}
	byKey := map[string][]span{}
	for _, r := range rs {
		k := fmt.Sprint(r.proc, r.key, r.seq)
		if r.start {
			open[k] = r
			continue
		}
		if s, ok := open[k]; ok {
			byKey[r.key] = append(byKey[r.key], span{s.at, r.at, r.proc})
			delete(open, k)
		}
	}
	overlaps := 0
	for key, ss := range byKey {
		slices.SortFunc(ss, func(a, b span) int { return int(a.start - b.start) })
		for i := 1; i < len(ss); i++ {
			if ss[i].start < ss[i-1].end && ss[i].proc != ss[i-1].proc {
				overlaps++
				if overlaps <= 5 {
					t.Errorf("key %s ran in processes %d and %d at once", key, ss[i-1].proc, ss[i].proc)
				}
			}
		}
	}
	t.Logf("%d records, %d attempts started, %d redeliveries of completed records, %d order violations, %d overlaps",
		keys*perKey, starts, dup, violations, overlaps)
}
