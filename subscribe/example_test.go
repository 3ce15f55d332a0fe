package subscribe_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/keyorder/keyorder"
	_ "github.com/keyorder/keyorder/adapters/memory" // registers mem://
	"github.com/keyorder/keyorder/lanes"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// Run handles messages on keyed worker lanes: one key stays on one lane and
// keeps its order, different keys run concurrently. Under Ordered a failed
// message is retried (with backoff) before anything behind it in its key;
// other keys are not held. Run returns once its context ends and the running
// handlers have finished.
func ExampleSubscriber_Run() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	// Subscribe first: a subscription receives only what is published after it exists.
	sub, err := subscribe.Open(ctx, "mem://example.run?subscription=run-demo&ordering=ordered",
		&subscribe.Config{Workers: 4, Assign: lanes.ByKey})
	if err != nil {
		panic(err)
	}
	defer sub.Close()
	pub, err := publish.Open(ctx, "mem://example.run", nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close(context.Background())
	for _, m := range []struct{ key, payload string }{
		{"acct-42", "101"}, {"acct-7", "201"}, {"acct-42", "102"}, {"acct-7", "202"}, {"acct-42", "103"},
	} {
		if _, err := pub.Publish(ctx, &keyorder.Message{Key: m.key, Payload: []byte(m.payload)}); err != nil {
			panic(err)
		}
	}

	var (
		mu      sync.Mutex // handlers of different keys run concurrently
		history = map[string][]string{}
		acked   atomic.Int32
	)
	err = sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
		var err error
		outcome := "ack"
		if string(d.Payload) == "101" && d.Attempt == 1 {
			err, outcome = errors.New("balance store unavailable"), "retry"
		}
		mu.Lock()
		history[d.Key] = append(history[d.Key], fmt.Sprintf("%s#%d(%s)", d.Payload, d.Attempt, outcome))
		mu.Unlock()
		if err == nil && acked.Add(1) == 5 {
			stop()
		}
		return err // nil acks; an error retries; keyorder.Permanent(err) dead-letters
	})
	if err != nil {
		panic(err)
	}

	keys := make([]string, 0, len(history))
	for k := range history {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Println(k+":", strings.Join(history[k], " "))
	}
	// Output:
	// acct-42: 101#1(retry) 101#2(ack) 102#1(ack) 103#1(ack)
	// acct-7: 201#1(ack) 202#1(ack)
}

// A message that cannot be handled is dead-lettered (here at once, with
// keyorder.Permanent; otherwise after Config.Retry's MaxAttempts) and its key
// goes on. DeadLetters lists what was dead-lettered, with its reason and
// attempts; Redrive puts messages back once the cause is fixed, after
// everything that arrived meanwhile.
func ExampleSubscriber_Redrive() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	sub, err := subscribe.Open(ctx, "mem://example.redrive?subscription=redrive-demo&ordering=ordered", nil)
	if err != nil {
		panic(err)
	}
	defer sub.Close()
	pub, err := publish.Open(ctx, "mem://example.redrive", nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close(context.Background())
	publishAll := func(payloads ...string) {
		for _, p := range payloads {
			if _, err := pub.Publish(ctx, &keyorder.Message{Key: "acct-42", Payload: []byte(p)}); err != nil {
				panic(err)
			}
		}
	}
	publishAll("101", "102", "103")

	var fixed atomic.Bool // the cause of 102's failure, fixed later
	handled103, handledRedriven := make(chan struct{}), make(chan struct{})
	ran := make(chan error, 1)
	go func() {
		ran <- sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
			if string(d.Payload) == "102" && !fixed.Load() {
				fmt.Println("102: account closed, dead-lettered")
				return keyorder.Permanent(errors.New("account closed"))
			}
			fmt.Println(string(d.Payload) + ": applied")
			switch string(d.Payload) {
			case "103":
				close(handled103)
			case "102":
				close(handledRedriven)
			}
			return nil
		})
	}()

	<-handled103 // under Ordered 103 runs only after 102 is settled
	dead, err := sub.DeadLetters(ctx, 0)
	if err != nil {
		panic(err)
	}
	var ids []string
	for _, dl := range dead {
		fmt.Printf("dead letter %s: %d attempt(s), %s\n", dl.Message.Payload, dl.Attempts, dl.Reason)
		ids = append(ids, dl.Message.ID)
	}

	publishAll("104") // arrives before the redrive
	fixed.Store(true)
	n, err := sub.Redrive(ctx, ids)
	if err != nil {
		panic(err)
	}

	<-handledRedriven
	stop()
	if err := <-ran; err != nil {
		panic(err)
	}
	fmt.Println("redriven:", n)
	// Output:
	// 101: applied
	// 102: account closed, dead-lettered
	// 103: applied
	// dead letter 102: 1 attempt(s), permanent: account closed
	// 104: applied
	// 102: applied
	// redriven: 1
}
