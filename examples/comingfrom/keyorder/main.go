// Command keyorder is the consumer of the "Coming from" pages on keyorder:
// five balance adjustments to two accounts, the first attempt of 101
// failing. Under Ordered the retry of 101 runs before 102 and 103 of its
// account; acct-7 is not held.
//
// It runs on the in-memory backend. KEYORDER_TOPIC and
// KEYORDER_SUBSCRIPTION (URLs) move it to another backend unchanged, e.g.
//
//	KEYORDER_TOPIC='kafka://127.0.0.1:9092/ledger?create=true'
//	KEYORDER_SUBSCRIPTION='kafka://127.0.0.1:9092/ledger?group=apply-balance&create=true'
//
//	KEYORDER_TOPIC='postgres://app@db/app?topic=ledger&migrate=true'
//	KEYORDER_SUBSCRIPTION='postgres://app@db/app?topic=ledger&subscription=apply-balance&create=true'
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/keyorder/keyorder"
	_ "github.com/keyorder/keyorder/adapters/kafka"
	_ "github.com/keyorder/keyorder/adapters/memory"
	_ "github.com/keyorder/keyorder/adapters/postgres"
	_ "github.com/keyorder/keyorder/adapters/pubsub"
	_ "github.com/keyorder/keyorder/adapters/sqs"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// adjustments are published in this order: id, account, delta.
var adjustments = []struct {
	id, account string
	delta       int
}{
	{"101", "acct-42", -800}, {"102", "acct-42", +500}, {"103", "acct-42", -600},
	{"201", "acct-7", +100}, {"202", "acct-7", -50},
}

func main() {
	topic := cmp.Or(os.Getenv("KEYORDER_TOPIC"), "mem://ledger")
	subscription := cmp.Or(os.Getenv("KEYORDER_SUBSCRIPTION"), "mem://ledger?subscription=apply-balance")
	applied, err := run(context.Background(), topic, subscription)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("applied:", strings.Join(applied["all"], " "))
	for _, acct := range []string{"acct-42", "acct-7"} {
		fmt.Println(acct, strings.Join(applied[acct], " "))
	}
}

// run publishes the adjustments and applies them; it returns the ids
// applied per account, in the order they were applied, and under "all" in
// the order applied overall.
func run(ctx context.Context, topicURL, subURL string) (map[string][]string, error) {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	// Subscribe first: a subscription receives what is published after it
	// exists. Ordered is the default: one message of a key at a time, a
	// failed one retried before anything behind it.
	sub, err := subscribe.Open(ctx, subURL, &subscribe.Config{Workers: 4})
	if err != nil {
		return nil, err
	}
	defer sub.Close(context.Background())
	pub, err := publish.Open(ctx, topicURL, nil)
	if err != nil {
		return nil, err
	}
	defer pub.Close(context.Background())
	for _, a := range adjustments {
		m := &keyorder.Message{Key: a.account, Payload: []byte(a.id + " " + strconv.Itoa(a.delta))}
		if _, err := pub.Publish(ctx, m); err != nil {
			return nil, err
		}
	}

	var mu sync.Mutex
	applied := map[string][]string{}
	n := 0
	err = sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
		id, _, _ := strings.Cut(string(d.Payload), " ")
		if id == "101" && d.Attempt == 1 {
			return errors.New("balance service timed out") // retried, with backoff
		}
		mu.Lock()
		defer mu.Unlock()
		applied[d.Key] = append(applied[d.Key], id)
		applied["all"] = append(applied["all"], id)
		if n++; n == len(adjustments) {
			stop()
		}
		return nil
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		return nil, err
	}
	return applied, nil
}
