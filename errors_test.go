package keyorder_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

func TestErrorCodeString(t *testing.T) {
	for c, want := range map[keyorder.ErrorCode]string{
		keyorder.CodeUnknown: "Unknown", keyorder.CodeNotFound: "NotFound",
		keyorder.CodeFailedPrecondition: "FailedPrecondition", keyorder.CodeDeadlineExceeded: "DeadlineExceeded",
		keyorder.ErrorCode(99): "ErrorCode(99)",
	} {
		if got := c.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(c), got, want)
		}
	}
	// Every code's *Error matches a keyorder sentinel (or the context's
	// error) and reads back its code.
	for c := keyorder.CodeUnknown; c <= keyorder.CodeDeadlineExceeded; c++ {
		err := &keyorder.Error{Code: c, Op: "x", Err: errors.New("driver")}
		if keyorder.Code(err) != c {
			t.Errorf("Code(*Error{%v}) = %v", c, keyorder.Code(err))
		}
		if len(err.Unwrap()) != 2 {
			t.Errorf("*Error{%v} has no sentinel", c)
		}
	}
}

// TestPortableErrorsHaveCodes: each error the portable API returns, on the
// memory backend, matches a keyorder sentinel and carries the code its docs
// promise.
func TestPortableErrorsHaveCodes(t *testing.T) {
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	check := func(name string, err error, sentinel error, code keyorder.ErrorCode) {
		t.Helper()
		if !errors.Is(err, sentinel) || keyorder.Code(err) != code {
			t.Errorf("%s: %v (code %v), want %v with %v", name, err, keyorder.Code(err), sentinel, code)
		}
	}
	_, err := publish.Open(ctx, "mem://t?bogus=1", nil)
	check("publish.Open bad parameter", err, keyorder.ErrBadURL, keyorder.CodeInvalidArgument)
	_, err = publish.Open(ctx, "nope://t", nil)
	check("publish.Open unknown scheme", err, keyorder.ErrUnknownScheme, keyorder.CodeInvalidArgument)
	_, err = publish.Open(ctx, "mem://t", &publish.Config{MaxBatch: -1})
	check("publish.Open bad config", err, keyorder.ErrInvalidConfig, keyorder.CodeInvalidArgument)

	if _, err := subscribe.Open(ctx, "mem://codes?subscription=s&ordering=ordered", nil); err != nil {
		t.Fatal(err)
	}
	_, err = subscribe.Open(ctx, "mem://codes?subscription=s&ordering=parallel", nil)
	check("subscribe.Open other ordering", err, keyorder.ErrFailedPrecondition, keyorder.CodeFailedPrecondition)

	b := memory.NewBroker()
	b.CreateTopic("t", &memory.TopicOptions{MaxKeyBytes: 4})
	pub, err := publish.New(memhook.Of(b).TopicDriver("t"), &publish.Config{Logger: quiet, SendRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	_, err = pub.Publish(ctx, &keyorder.Message{Payload: []byte("x")})
	check("Publish no key", err, keyorder.ErrMissingKey, keyorder.CodeInvalidArgument)
	_, err = pub.Publish(ctx, &keyorder.Message{Key: "too-long", Payload: []byte("x")})
	check("Publish key too long", err, keyorder.ErrInvalidMessage, keyorder.CodeInvalidArgument)
	memhook.Of(b).FailSends("t", func([]*driver.Message) error { return errors.New("boom") })
	_, err = pub.Publish(ctx, &keyorder.Message{Key: "k", Payload: []byte("x")})
	check("Publish broker failure", err, keyorder.ErrBackend, keyorder.CodeUnknown)
	memhook.Of(b).FailSends("t", func([]*driver.Message) error { return memhook.ErrTransient })
	_, err = pub.Publish(ctx, &keyorder.Message{Key: "k2", Payload: []byte("x")})
	check("Publish transient failure", err, keyorder.ErrUnavailable, keyorder.CodeUnavailable)
	memhook.Of(b).FailSends("t", nil)
	_, err = pub.Publish(ctx, &keyorder.Message{Key: "k", Payload: []byte("x")})
	check("Publish paused key", err, keyorder.ErrKeyPaused, keyorder.CodeFailedPrecondition)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = pub.Publish(cctx, &keyorder.Message{Key: "k3", Payload: []byte("x")})
	check("Publish canceled", err, context.Canceled, keyorder.CodeCanceled)
	pub.Close(ctx)
	_, err = pub.Publish(ctx, &keyorder.Message{Key: "k3", Payload: []byte("x")})
	check("Publish closed", err, keyorder.ErrClosed, keyorder.CodeFailedPrecondition)

	if err := b.CreateSubscription("t", "s", nil); err != nil {
		t.Fatal(err)
	}
	drv, err := memhook.Of(b).SubscriptionDriver("s")
	if err != nil {
		t.Fatal(err)
	}
	sub, err := subscribe.New(drv, &subscribe.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	err = sub.Run(ctx, nil)
	check("Run nil handler", err, keyorder.ErrInvalidConfig, keyorder.CodeInvalidArgument)
	sub2, err := subscribe.New(struct{ driver.Subscription }{drv}, &subscribe.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	_, err = sub2.DeadLetters(ctx, 10)
	check("DeadLetters unsupported", err, keyorder.ErrUnsupported, keyorder.CodeUnimplemented)
	_, err = sub2.Redrive(ctx, []string{"x"})
	check("Redrive unsupported", err, keyorder.ErrUnsupported, keyorder.CodeUnimplemented)
	drv.Close()
	_, err = sub.DeadLetters(ctx, 10)
	if err != nil {
		check("DeadLetters closed", err, keyorder.ErrBackend, keyorder.CodeUnknown)
	}
}

// Permanent and RetryAfter of a nil error are nil (success), and a
// negative delay is clamped to 0 rather than panicking.
func TestErrorWrappersOfNil(t *testing.T) {
	if err := keyorder.Permanent(nil); err != nil {
		t.Errorf("Permanent(nil) = %v, want nil", err)
	}
	if err := keyorder.RetryAfter(nil, time.Second); err != nil {
		t.Errorf("RetryAfter(nil, 1s) = %v, want nil", err)
	}
	base := errors.New("boom")
	var re *keyorder.RetryError
	if err := keyorder.RetryAfter(base, time.Until(time.Now().Add(-time.Hour))); !errors.As(err, &re) || re.After != 0 || !errors.Is(err, base) {
		t.Errorf("RetryAfter(err, -1h) = %#v, want After 0 wrapping err", err)
	}
	if err := keyorder.RetryAfter(base, time.Second); !errors.As(err, &re) || re.After != time.Second {
		t.Errorf("RetryAfter(err, 1s) = %#v", err)
	}
	var pe *keyorder.PermanentError
	if err := keyorder.Permanent(base); !errors.As(err, &pe) || !errors.Is(err, base) {
		t.Errorf("Permanent(err) = %#v", err)
	}
}
