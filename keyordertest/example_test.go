package keyordertest_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/keyordertest"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// A ledger pipeline, checked: adjustment 101 fails once, and under Ordered
// its retry must run before 102. In a test, use keyordertest.StartConsumer
// and keyordertest.Check(t, rec, spec) instead of the plumbing here, and
// run it inside testing/synctest so backoffs take no time.
func Example() {
	ctx := context.Background()
	b := memory.NewBroker()
	b.CreateSubscription("ledger", "apply-balance", &memory.SubscriptionOptions{Ordering: policy.Ordered})
	pub, _ := b.OpenTopic("ledger", nil)
	defer pub.Close(ctx)

	// Record every handling; fail adjustment 101's first attempt.
	rec := keyordertest.NewRecorder(nil)
	sub, _ := b.OpenSubscription("apply-balance", &subscribe.Config{
		Workers: 4,
		Retry:   policy.Retry{MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond},
		Middleware: []subscribe.Middleware{
			rec.Middleware(), // outermost: sees what the subscriber sees
			keyordertest.FailHandler(keyordertest.Fault{Payload: "101", Attempt: 1}),
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() {
		done <- sub.Run(runCtx, func(ctx context.Context, d *keyorder.Delivery) error {
			return nil // apply the adjustment
		})
	}()

	for _, p := range []string{"101", "102", "103", "104"} {
		m := &keyorder.Message{ID: keyorder.NewID(), Key: "acct-42", Payload: []byte(p)}
		if _, err := pub.Publish(ctx, m); err != nil {
			panic(err)
		}
		rec.Published(m) // by its ID, chosen before publishing
	}
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := rec.WaitResolved(waitCtx); err != nil {
		panic(err)
	}
	stop()
	<-done

	rep, err := keyordertest.Verify(rec.History(), keyordertest.Spec{Ordering: policy.Ordered})
	fmt.Println("violations:", err)
	fmt.Println("messages:", rep.Messages, "handlings:", rep.Handlings, "outcomes:", rep.Outcomes)

	// Output:
	// violations: <nil>
	// messages: 4 handlings: 5 outcomes: map[ack:4 retry:1]
}

// What a violation looks like: under Ordered, 102 ran while 101 waited for
// its retry, as it would on a subscription created Exclusive.
func ExampleVerify() {
	t0 := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	h := keyordertest.History{
		Published: []keyordertest.Published{
			{Key: "acct-42", ID: "m-101", Label: "101"},
			{Key: "acct-42", ID: "m-102", Label: "102"},
		},
		Handlings: []keyordertest.Handling{
			{Key: "acct-42", ID: "m-101", Label: "101", Attempt: 1, Start: at(0), End: at(1), StartSeq: 1, EndSeq: 2, Outcome: keyordertest.Retry},
			{Key: "acct-42", ID: "m-102", Label: "102", Attempt: 1, Start: at(1), End: at(2), StartSeq: 3, EndSeq: 4, Outcome: keyordertest.Ack},
			{Key: "acct-42", ID: "m-101", Label: "101", Attempt: 2, Start: at(5), End: at(6), StartSeq: 5, EndSeq: 6, Outcome: keyordertest.Ack},
		},
	}
	rep, err := keyordertest.Verify(h, keyordertest.Spec{Ordering: policy.Ordered})
	fmt.Println(err)
	fmt.Print(rep.Timeline("acct-42"))
	_, err = keyordertest.Verify(h, keyordertest.Spec{Ordering: policy.Exclusive})
	fmt.Println("as Exclusive:", err)
	// Output:
	// keyordertest: head of line rule broken: key "acct-42": message 102 (ID m-102) (attempt 1) started at +1s while message 101 (ID m-101), published before it, was unresolved: it was resolved only at +6s (ack); under Ordered a key's next message waits until the one before it is acknowledged or dead-lettered
	//   #1 101 attempt 1: started at +0s, ended at +1s: retry
	//   #3 102 attempt 1: started at +1s, ended at +2s: ack
	//   #5 101 attempt 2: started at +5s, ended at +6s: ack
	// as Exclusive: <nil>
}
