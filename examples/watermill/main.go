// Command watermill is the ledger example on a Watermill router: the
// router, its handler and Watermill's middleware stay as they are; keyorder
// supplies the subscriber (any backend, chosen by KEYORDER_URL) and the
// per-key middleware.
//
// Message 101 subtracts 800 from acct-42 and fails once (the balance service
// times out); 102 adds 500; 103 subtracts 600. acct-7 runs beside them.
// The keyorder middleware retries 101 in place, before 102 and 103; the
// subscriber hands acct-7's messages to the router meanwhile. A message
// that keeps failing would go to the poison queue and its key move on.
//
// It runs on the in-memory backend by default; set KEYORDER_URL to a topic
// URL template with {topic} (for example postgres://…?topic={topic}&migrate=true&create=true,
// pubsub://demo/{topic}, sqs://{topic}.fifo?endpoint=…) to run it there.
// It prints each account's history and exits non-zero if an account's
// history is not the order its adjustments were published in.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/keyorder/keyorder"
	_ "github.com/keyorder/keyorder/adapters/memory"
	_ "github.com/keyorder/keyorder/adapters/postgres"
	_ "github.com/keyorder/keyorder/adapters/pubsub"
	_ "github.com/keyorder/keyorder/adapters/pulsar"
	_ "github.com/keyorder/keyorder/adapters/sqs"
	wmk "github.com/keyorder/keyorder/adapters/watermill"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

type adjustment struct {
	id      string
	account string
	delta   int
}

var adjustments = []adjustment{
	{"101", "acct-42", -800},
	{"102", "acct-42", +500},
	{"103", "acct-42", -600},
	{"201", "acct-7", +100},
	{"202", "acct-7", -50},
}

const opening = 1000

// ledger applies adjustments and records each account's history.
type ledger struct {
	mu       sync.Mutex
	balance  map[string]int
	history  map[string][]string
	applied  map[string][]string // ids applied, per account
	failed   bool
	complete chan struct{}
}

func newLedger() *ledger {
	return &ledger{balance: map[string]int{}, history: map[string][]string{}, applied: map[string][]string{}, complete: make(chan struct{})}
}

// handle is an ordinary Watermill handler.
func (l *ledger) handle(m *message.Message) error {
	acct := m.Metadata.Get(keyorder.HeaderPartitionKey)
	id, d, _ := strings.Cut(string(m.Payload), " ")
	delta, _ := strconv.Atoi(d)
	l.mu.Lock()
	defer l.mu.Unlock()
	if id == "101" && !l.failed {
		l.failed = true
		l.history[acct] = append(l.history[acct], "101 failed")
		return errors.New("balance service timed out")
	}
	if slices.Contains(l.applied[acct], id) {
		return nil // a redelivery: handlers are idempotent
	}
	if _, ok := l.balance[acct]; !ok {
		l.balance[acct] = opening
	}
	l.balance[acct] += delta
	l.history[acct] = append(l.history[acct], fmt.Sprintf("%s %+d = %d", id, delta, l.balance[acct]))
	l.applied[acct] = append(l.applied[acct], id)
	n := 0
	for _, ids := range l.applied {
		n += len(ids)
	}
	if n == len(adjustments) {
		close(l.complete)
	}
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "watermill:", err)
		os.Exit(1)
	}
}

func run() error {
	tmpl := os.Getenv("KEYORDER_URL")
	if tmpl == "" {
		tmpl = "mem://{topic}"
	}
	if !strings.Contains(tmpl, wmk.PlaceholderTopic) {
		return fmt.Errorf("KEYORDER_URL %q has no %s placeholder", tmpl, wmk.PlaceholderTopic)
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	topic := "ledger-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)

	pub, err := wmk.NewPublisher(wmk.PublisherConfig{URL: tmpl})
	if err != nil {
		return err
	}
	sub, err := wmk.NewSubscriber(wmk.SubscriberConfig{
		URL: subscriptionTemplate(tmpl), Group: "apply-balance",
		Subscribe: &subscribe.Config{Workers: 4},
	})
	if err != nil {
		return err
	}
	if err := sub.SubscribeInitialize(topic); err != nil {
		return err
	}

	// The keyorder middleware, stacked as docs/watermill.md says: PoisonQueue
	// outermost, then keyorder, then Retry (none here) and Recoverer.
	km, err := wmk.NewMiddleware(policy.Ordered, &wmk.MiddlewareConfig{
		Retry: policy.Retry{MaxAttempts: 3, MinBackoff: 300 * time.Millisecond},
	})
	if err != nil {
		return err
	}
	logger := watermill.NopLogger{}
	poison := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	pq, err := middleware.PoisonQueue(poison, "ledger.poison")
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	router.AddMiddleware(pq, km.Middleware, middleware.Recoverer)
	l := newLedger()
	router.AddConsumerHandler("apply-balance", topic, sub, l.handle)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	<-router.Running()

	for _, a := range adjustments {
		m := message.NewMessage(topic+"-"+a.id, fmt.Appendf(nil, "%s %d", a.id, a.delta))
		m.Metadata.Set(keyorder.HeaderPartitionKey, a.account)
		if err := pub.Publish(topic, m); err != nil {
			return fmt.Errorf("publish %s: %w", a.id, err)
		}
	}
	if err := pub.Close(); err != nil {
		return err
	}
	select {
	case <-l.complete:
	case <-time.After(60 * time.Second):
		return errors.New("not every adjustment was applied within 60s")
	}
	cancel()
	if err := <-done; err != nil {
		return err
	}
	km.Close(context.Background())
	poison.Close()

	scheme, _, _ := strings.Cut(tmpl, ":") // the URL may hold a password: print its scheme only
	fmt.Printf("keyorder on a Watermill router, backend %s (opening balance %d)\n\n", scheme, opening)
	broken := false
	for _, acct := range []string{"acct-42", "acct-7"} {
		fmt.Printf("%-7s  %s\n", acct, strings.Join(l.history[acct], "  ->  "))
		var want []string
		for _, a := range adjustments {
			if a.account == acct {
				want = append(want, a.id)
			}
		}
		if !slices.Equal(l.applied[acct], want) {
			broken = true
			fmt.Printf("         ORDER BROKEN: applied %v, published %v\n", l.applied[acct], want)
		}
	}
	if broken {
		return errors.New("an account's adjustments were applied out of order")
	}
	fmt.Println("\n101 was retried in place before 102 and 103; acct-7 was not held.")
	return nil
}

// subscriptionTemplate derives the subscriber's template from the topic's:
// a subscription named after the topic and group (memory and Pub/Sub names
// are global), ordered. An SQS FIFO queue is its own subscription.
func subscriptionTemplate(topicTmpl string) string {
	sep := "?"
	if strings.Contains(topicTmpl, "?") {
		sep = "&"
	}
	if strings.HasPrefix(topicTmpl, "sqs:") {
		return topicTmpl + sep + "ordering=ordered"
	}
	return topicTmpl + sep + "subscription={topic}-{group}&ordering=ordered"
}
