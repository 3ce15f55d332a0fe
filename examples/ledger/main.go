// Command ledger is the balance example from keyorder's design: adjustments
// to an account must be applied in order, and a failed adjustment must hold
// the ones behind it.
//
// Message 101 subtracts 800 from acct-42 and fails once (the balance service
// times out); 102 adds 500; 103 subtracts 600. The same messages are consumed
// by two subscriptions: one Ordered, where 102 and 103 wait for 101's retry,
// and one Exclusive, where they may overtake it and the account goes through
// a different balance history. acct-7 runs beside them, unaffected.
//
// It runs on the in-memory backend by default; set KEYORDER_URL to a topic
// URL of another backend (its adapter must be linked in) to run it there.
// It exits non-zero if the Ordered history is wrong.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/keyorder/keyorder"
	_ "github.com/keyorder/keyorder/adapters/memory"
	_ "github.com/keyorder/keyorder/adapters/postgres"
	_ "github.com/keyorder/keyorder/adapters/pubsub"
	_ "github.com/keyorder/keyorder/adapters/pulsar"
	_ "github.com/keyorder/keyorder/adapters/sqs"
	"github.com/keyorder/keyorder/publish"
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
	failed   map[string]bool
	applied  int
	complete chan struct{}
}

func newLedger() *ledger {
	return &ledger{balance: map[string]int{}, history: map[string][]string{}, failed: map[string]bool{}, complete: make(chan struct{})}
}

func (l *ledger) handle(ctx context.Context, d *keyorder.Delivery) error {
	parts := strings.Split(string(d.Payload), " ")
	delta, _ := strconv.Atoi(parts[1])
	l.mu.Lock()
	defer l.mu.Unlock()
	if parts[0] == "101" && !l.failed["101"] {
		l.failed["101"] = true
		l.history[d.Key] = append(l.history[d.Key], "101 failed")
		return keyorder.RetryAfter(errors.New("balance service timed out"), 300*time.Millisecond)
	}
	if _, ok := l.balance[d.Key]; !ok {
		l.balance[d.Key] = opening
	}
	l.balance[d.Key] += delta
	l.history[d.Key] = append(l.history[d.Key], fmt.Sprintf("%s %+d = %d", parts[0], delta, l.balance[d.Key]))
	l.applied++
	if l.applied == len(adjustments) {
		close(l.complete)
	}
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "ledger:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx := context.Background()
	topicURL := os.Getenv("KEYORDER_URL")
	if topicURL == "" {
		topicURL = "mem://ledger.adjustments"
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	run := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)

	results := map[string]*ledger{}
	var subs []*subscribe.Subscriber
	var wg sync.WaitGroup
	for _, ordering := range []string{"ordered", "exclusive"} {
		u, err := subscriptionURL(topicURL, "apply-balance-"+ordering+"-"+run, ordering)
		if err != nil {
			return err
		}
		sub, err := subscribe.Open(ctx, u, &subscribe.Config{Workers: 4})
		if err != nil {
			return fmt.Errorf("open %s subscription: %w", ordering, err)
		}
		l := newLedger()
		results[ordering] = l
		subs = append(subs, sub)
		wg.Go(func() {
			if err := sub.Run(ctx, l.handle); err != nil {
				fmt.Fprintln(os.Stderr, "subscriber:", err)
			}
		})
	}

	pub, err := publish.Open(ctx, topicURL, nil)
	if err != nil {
		return err
	}
	for _, a := range adjustments {
		m := &keyorder.Message{ID: run + "-" + a.id, Key: a.account, Payload: fmt.Appendf(nil, "%s %d", a.id, a.delta)}
		if _, err := pub.Publish(ctx, m); err != nil {
			return fmt.Errorf("publish %s: %w", a.id, err)
		}
	}
	if err := pub.Close(ctx); err != nil {
		return err
	}

	timeout := time.After(60 * time.Second)
	for name, l := range results {
		select {
		case <-l.complete:
		case <-timeout:
			return fmt.Errorf("%s subscription did not apply every adjustment within 60s", name)
		}
	}
	for _, s := range subs {
		s.Shutdown(ctx)
		s.Close()
	}
	wg.Wait()

	fmt.Printf("keyorder ledger demo on %s (opening balance %d)\n\n", topicURL, opening)
	for _, ordering := range []string{"ordered", "exclusive"} {
		l := results[ordering]
		for _, acct := range []string{"acct-42", "acct-7"} {
			fmt.Printf("%-9s %-7s  %s\n", ordering, acct, strings.Join(l.history[acct], "  ->  "))
		}
	}
	want := []string{"101 failed", "101 -800 = 200", "102 +500 = 700", "103 -600 = 100"}
	got := results["ordered"].history["acct-42"]
	if !slices.Equal(got, want) {
		return fmt.Errorf("ordered history of acct-42 is %q, want %q", got, want)
	}
	fmt.Println("\nOrdered: 102 and 103 waited for 101's retry; the history is the one the ledger was written in.")
	if ex := results["exclusive"].history["acct-42"]; !slices.Equal(ex, want) {
		fmt.Println("Exclusive: later adjustments overtook the failed 101, a different balance history.")
	}
	return nil
}

// subscriptionURL adds subscription and ordering parameters to a topic URL,
// the convention every keyorder adapter accepts.
func subscriptionURL(topicURL, name, ordering string) (string, error) {
	u, err := url.Parse(topicURL)
	if err != nil {
		return "", err
	}
	q := u.Query()
	q.Set("subscription", name)
	q.Set("ordering", ordering)
	u.RawQuery = q.Encode()
	return u.String(), nil
}
