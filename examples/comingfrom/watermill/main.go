// Command watermill is the consumer of the "Coming from" pages written with
// a Watermill router over its GoChannel pub/sub: five balance adjustments to
// two accounts, the first attempt of 101 failing.
//
// GoChannel keeps the publish order only when it hands over one message
// at a time (BlockPublishUntilSubscriberAck; without it each message goes
// to the handler on a goroutine of its own, in any order). The Retry
// middleware retries 101 in place, so acct-42 keeps its order, and acct-7
// waits for 101's retries too: every id is printed in publish order.
// Handing over several at once would let acct-7 go on, and acct-42's
// order with it. Compare with ../keyorder, where only acct-42 waits.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

var adjustments = []struct{ id, account, delta string }{
	{"101", "acct-42", "-800"}, {"102", "acct-42", "+500"}, {"103", "acct-42", "-600"},
	{"201", "acct-7", "+100"}, {"202", "acct-7", "-50"},
}

func main() {
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true, BlockPublishUntilSubscriberAck: true}, logger)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(
		middleware.Retry{MaxRetries: 3, InitialInterval: 100 * time.Millisecond, Logger: logger}.Middleware,
		middleware.Recoverer,
	)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var mu sync.Mutex
	applied := map[string][]string{}
	failed, n := false, 0
	router.AddConsumerHandler("apply-balance", "ledger", pubSub, func(m *message.Message) error {
		id, _, _ := strings.Cut(string(m.Payload), " ")
		acct := m.Metadata.Get("account")
		mu.Lock()
		defer mu.Unlock()
		if id == "101" && !failed {
			failed = true
			return errors.New("balance service timed out")
		}
		applied[acct] = append(applied[acct], id)
		applied["all"] = append(applied["all"], id)
		if n++; n == len(adjustments) {
			stop()
		}
		return nil
	})
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	<-router.Running()
	for _, a := range adjustments {
		m := message.NewMessage(watermill.NewUUID(), []byte(a.id+" "+a.delta))
		m.Metadata.Set("account", a.account)
		if err := pubSub.Publish("ledger", m); err != nil {
			log.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	fmt.Println("applied:", strings.Join(applied["all"], " "))
	for _, acct := range []string{"acct-42", "acct-7"} {
		fmt.Println(acct, strings.Join(applied[acct], " "))
	}
}
