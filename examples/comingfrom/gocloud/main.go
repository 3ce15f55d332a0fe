// Command gocloud is the consumer of the "Coming from" pages written with
// gocloud.dev/pubsub, on its in-memory driver (mempubsub): five balance
// adjustments to two accounts, the first attempt of 101 failing.
//
// Four goroutines call Receive, as gocloud's documentation suggests for
// throughput. Nothing holds acct-42 while 101 waits for its redelivery, so
// 102 and 103 are usually applied first: the history printed differs from
// run to run. Compare with ../keyorder.
package main

import (
	"context"
	"fmt"
	"log"
	"strings"
	"sync"

	"gocloud.dev/pubsub"
	_ "gocloud.dev/pubsub/mempubsub" // registers mem://
)

var adjustments = []struct{ id, account, delta string }{
	{"101", "acct-42", "-800"}, {"102", "acct-42", "+500"}, {"103", "acct-42", "-600"},
	{"201", "acct-7", "+100"}, {"202", "acct-7", "-50"},
}

func main() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	topic, err := pubsub.OpenTopic(ctx, "mem://ledger")
	if err != nil {
		log.Fatal(err)
	}
	defer topic.Shutdown(context.Background())
	// mempubsub's subscription URL names its topic.
	sub, err := pubsub.OpenSubscription(ctx, "mem://ledger")
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Shutdown(context.Background())
	for _, a := range adjustments {
		m := &pubsub.Message{Body: []byte(a.id + " " + a.delta), Metadata: map[string]string{"account": a.account}}
		if err := topic.Send(ctx, m); err != nil {
			log.Fatal(err)
		}
	}

	var mu sync.Mutex
	applied := map[string][]string{}
	failed, n := false, 0
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				m, err := sub.Receive(ctx)
				if err != nil {
					return // ctx cancelled: done
				}
				id, _, _ := strings.Cut(string(m.Body), " ")
				acct := m.Metadata["account"]
				mu.Lock()
				if id == "101" && !failed {
					failed = true
					mu.Unlock()
					m.Nack() // redelivered; nothing holds acct-42 meanwhile
					continue
				}
				applied[acct] = append(applied[acct], id)
				applied["all"] = append(applied["all"], id)
				if n++; n == len(adjustments) {
					stop()
				}
				mu.Unlock()
				m.Ack()
			}
		})
	}
	wg.Wait()
	fmt.Println("applied:", strings.Join(applied["all"], " "))
	for _, acct := range []string{"acct-42", "acct-7"} {
		fmt.Println(acct, strings.Join(applied[acct], " "))
	}
}
