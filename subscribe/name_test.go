package subscribe_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// TestDeliverySubscriptionIsTheName: a handler sees the subscription's
// name, never the URL it was opened with (which may hold secrets).
func TestDeliverySubscriptionIsTheName(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub, err := subscribe.Open(ctx, "mem://name-test?subscription=orders&hold=native", &subscribe.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	pub, err := publish.Open(ctx, "mem://name-test", &publish.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(ctx)
	if _, err := pub.Publish(ctx, &keyorder.Message{Key: "k", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- sub.Run(runCtx, func(_ context.Context, d *keyorder.Delivery) error {
			select {
			case got <- d.Subscription:
			default:
			}
			return nil
		})
	}()
	select {
	case name := <-got:
		if name != "orders" {
			t.Errorf("Delivery.Subscription = %q, want %q", name, "orders")
		}
	case <-ctx.Done():
		t.Fatal("no delivery")
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestOpenNeverEchoesSecrets: publish.Open and subscribe.Open errors,
// whatever the reason, carry no password.
func TestOpenNeverEchoesSecrets(t *testing.T) {
	ctx := context.Background()
	for _, raw := range []string{
		"mem://u:S3CRET@t?subscription=s",
		"mem://t?subscription=s&password=S3CRET",
		"nope://u:S3CRET@t",
		"mem://u:S3CRET@t:%zz",
		"mem://t#S3CRET",
		"u:S3CRET@t",
	} {
		_, err := publish.Open(ctx, raw, nil)
		if err == nil || strings.Contains(err.Error(), "S3CRET") || !(errors.Is(err, keyorder.ErrBadURL) || errors.Is(err, keyorder.ErrUnknownScheme)) {
			t.Errorf("publish.Open(%q) = %v", raw, err)
		}
		_, err = subscribe.Open(ctx, raw, nil)
		if err == nil || strings.Contains(err.Error(), "S3CRET") || !(errors.Is(err, keyorder.ErrBadURL) || errors.Is(err, keyorder.ErrUnknownScheme)) {
			t.Errorf("subscribe.Open(%q) = %v", raw, err)
		}
	}
}
