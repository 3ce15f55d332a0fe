package keyordertest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/keyordertest"
	"github.com/keyorder/keyorder/policy"
)

// TestFailSettlements checks the matching of SettleFault (operation, key,
// Times), Applied, ErrTransient and stop, at the driver, where each
// settlement call's outcome is seen directly.
func TestFailSettlements(t *testing.T) {
	ctx := context.Background()
	b := memory.NewBroker()
	// Parallel: one Receive hands out all three (Ordered would hold a's
	// second message behind its first).
	if err := b.CreateSubscription("t", "s", &memory.SubscriptionOptions{Ordering: policy.Parallel}); err != nil {
		t.Fatal(err)
	}
	if _, err := keyordertest.FailSettlements(b, "nope"); err == nil {
		t.Fatal("FailSettlements on a missing subscription succeeded")
	}
	pub, err := b.OpenTopic("t", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(ctx)
	for _, k := range []string{"a", "b", "a"} {
		if _, err := pub.Publish(ctx, &keyorder.Message{Key: k, Payload: []byte(k)}); err != nil {
			t.Fatal(err)
		}
	}
	drv, err := memhook.Of(b).SubscriptionDriver("s")
	if err != nil {
		t.Fatal(err)
	}
	ms, err := drv.Receive(ctx, 10)
	if err != nil || len(ms) != 3 {
		t.Fatalf("Receive = %d messages, %v; want 3", len(ms), err)
	}
	lost := fmt.Errorf("answer lost: %w", keyordertest.ErrTransient)
	stop, err := keyordertest.FailSettlements(b, "s",
		keyordertest.SettleFault{Ops: []keyordertest.SettleOp{keyordertest.SettleAck}, Keys: []string{"a"}, Times: 1},
		keyordertest.SettleFault{Ops: []keyordertest.SettleOp{keyordertest.SettleAck}, Keys: []string{"b"}, Err: lost, Applied: true},
	)
	if err != nil {
		t.Fatal(err)
	}
	ack := func(m *driver.Message) error { return drv.Ack(ctx, []*driver.Message{m}) }

	// The first ack of key a fails permanently, without effect.
	if err := ack(ms[0]); !errors.Is(err, keyordertest.ErrInjected) || drv.IsRetryable(err) {
		t.Fatalf("first ack of a = %v (retryable %v); want permanent ErrInjected", err, drv.IsRetryable(err))
	}
	// Times: 1 is used up, so the second ack of a goes through.
	if err := ack(ms[0]); err != nil {
		t.Fatalf("second ack of a = %v; want nil", err)
	}
	// Key b fails transiently after taking effect: acking again finds the
	// lease settled.
	if err := ack(ms[1]); !errors.Is(err, lost) || !drv.IsRetryable(err) {
		t.Fatalf("ack of b = %v (retryable %v); want the retryable injected error", err, drv.IsRetryable(err))
	}
	stop()
	if err := ack(ms[1]); err == nil {
		t.Fatal("ack of b after an applied ack succeeded; want lease not held")
	}
	if err := ack(ms[2]); err != nil {
		t.Fatalf("ack after stop = %v; want nil", err)
	}
}
