package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyorder/keyorder"
	_ "github.com/keyorder/keyorder/adapters/kafka"
	"github.com/keyorder/keyorder/internal/testenv"
	"github.com/keyorder/keyorder/subscribe"
)

// TestGroupOffsetsCarryOver answers the question of docs/coming-from-franz-go.md:
// when keyorder takes over a consumer group that a franz-go consumer
// committed offsets for, does it start where that consumer stopped? And
// when the franz-go consumer takes the group back, does it start after
// what keyorder handled?
//
// A franz-go member of group G consumes and commits 12 records over 4
// partitions and leaves. 6 more are produced; a keyorder subscription of G
// must receive exactly those 6 (the old ones come first in each partition,
// so one of them delivered would be among the first received). keyorder
// closes; 3 more are produced; a new franz-go member of G must receive
// exactly those 3.
func TestGroupOffsetsCarryOver(t *testing.T) {
	brokers := strings.Split(testenv.Require(t, testenv.Kafka), ",")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	topic := fmt.Sprintf("takeover-%d", time.Now().UnixNano())
	group := topic + "-g"

	admin, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	adm := kadm.NewClient(admin)
	if _, err := adm.CreateTopic(ctx, 4, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	// Wait until the topic answers ListOffsets on every partition (a new
	// topic's leaders take a moment).
	for {
		offs, err := adm.ListEndOffsets(ctx, topic)
		if err == nil && offs.Error() == nil && len(offs[topic]) == 4 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("topic %s not ready: %v", topic, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	produce := func(prefix string, n int) []string {
		t.Helper()
		var ids []string
		for i := range n {
			id := fmt.Sprintf("%s%02d", prefix, i)
			ids = append(ids, id)
			r := &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("acct-%d", i%6)), Value: []byte(id)}
			if err := admin.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		return ids
	}
	// consumeFranz joins G with franz-go, consumes until it has want
	// records, commits them and leaves.
	consumeFranz := func(want int) []string {
		t.Helper()
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
			kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		var got []string
		for len(got) < want {
			fs := cl.PollFetches(ctx)
			if err := fs.Err0(); err != nil {
				t.Fatalf("franz-go poll after %v: %v", got, err)
			}
			fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
			if err := cl.CommitUncommittedOffsets(ctx); err != nil {
				t.Fatal(err)
			}
		}
		cl.LeaveGroup()
		return got
	}

	old := produce("old", 12)
	if got := consumeFranz(len(old)); !sameSet(got, old) {
		t.Fatalf("franz-go consumed %v, want %v", got, old)
	}

	// keyorder takes the group over.
	fresh := produce("new", 6)
	sub, err := subscribe.Open(ctx, fmt.Sprintf("kafka://%s/%s?group=%s", strings.Join(brokers, ","), topic, group), &subscribe.Config{Workers: 4})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	runCtx, stop := context.WithCancel(ctx)
	err = sub.Run(runCtx, func(ctx context.Context, d *keyorder.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, string(d.Payload))
		if len(got) >= len(fresh) {
			stop()
		}
		return nil
	})
	stop()
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if err := sub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !sameSet(got, fresh) {
		t.Fatalf("keyorder took over the group and received %v, want only the records after franz-go's commit %v", got, fresh)
	}

	// franz-go takes the group back.
	last := produce("last", 3)
	if back := consumeFranz(len(last)); !sameSet(back, last) {
		t.Fatalf("franz-go took the group back and received %v, want only the records after keyorder's commit %v", back, last)
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
