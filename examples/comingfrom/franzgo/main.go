// Command franzgo is the consumer of the "Coming from" pages written with
// franz-go (twmb/franz-go), Kafka's Go client, in its usual shape: a
// consumer group member handling each record in its poll loop and
// committing what it handled. KAFKA_BROKERS names the brokers
// (127.0.0.1:9092 by default); the topic "ledger" is created on first use
// if the broker allows it.
//
// Kafka has no per-record nack, so the loop retries 101 in place, holding
// its whole partition — and every other partition this member owns, since
// one goroutine polls them all. Order is kept and a failure stalls every
// account. Handling records on more goroutines (a goroutine per partition,
// or Confluent's parallel-consumer in Java) trades that for work on
// commits and on keeping a key's records in order. Compare with
// ../keyorder on kafka://, where only acct-42 waits.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

var adjustments = []struct{ id, account, delta string }{
	{"101", "acct-42", "-800"}, {"102", "acct-42", "+500"}, {"103", "acct-42", "-600"},
	{"201", "acct-7", "+100"}, {"202", "acct-7", "-50"},
}

func main() {
	ctx := context.Background()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(strings.Split(cmp.Or(os.Getenv("KAFKA_BROKERS"), "127.0.0.1:9092"), ",")...),
		kgo.AllowAutoTopicCreation(),
		kgo.ConsumerGroup("apply-balance"),
		kgo.ConsumeTopics("ledger"),
		kgo.DisableAutoCommit(), // commit what was handled, after handling it
	)
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	for _, a := range adjustments {
		// The record key is the account: a key's records share a partition.
		r := &kgo.Record{Topic: "ledger", Key: []byte(a.account), Value: []byte(a.id + " " + a.delta)}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			log.Fatal(err)
		}
	}

	applied := map[string][]string{}
	failed := false
	handle := func(r *kgo.Record) error {
		id, _, _ := strings.Cut(string(r.Value), " ")
		if id == "101" && !failed {
			failed = true
			return errors.New("balance service timed out")
		}
		applied[string(r.Key)] = append(applied[string(r.Key)], id)
		applied["all"] = append(applied["all"], id)
		return nil
	}
	for len(applied["all"]) < len(adjustments) {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			log.Fatal(err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			for handle(r) != nil {
				time.Sleep(100 * time.Millisecond) // retry in place: the whole loop waits
			}
		})
		if err := cl.CommitUncommittedOffsets(ctx); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println("applied:", strings.Join(applied["all"], " "))
	for _, acct := range []string{"acct-42", "acct-7"} {
		fmt.Println(acct, strings.Join(applied[acct], " "))
	}
}
