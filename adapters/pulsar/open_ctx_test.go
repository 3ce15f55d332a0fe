package pulsar_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// unreachable returns a pulsar:// URL of a local port nothing listens on.
func unreachable(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "pulsar://" + addr + "/public/default/t"
}

// TestOpenHonoursContext: publish.Open and subscribe.Open of an unreachable
// broker return when their context ends, with its error, instead of
// waiting for the client's 30-second operation timeout.
func TestOpenHonoursContext(t *testing.T) {
	base := unreachable(t)
	opens := map[string]func(ctx context.Context) error{
		"publish.Open": func(ctx context.Context) error {
			p, err := publish.Open(ctx, base, nil)
			if err == nil {
				p.Close(context.Background())
			}
			return err
		},
		"subscribe.Open": func(ctx context.Context) error {
			s, err := subscribe.Open(ctx, base+"?subscription=s", nil)
			if err == nil {
				s.Close(context.Background())
			}
			return err
		},
	}
	for name, open := range opens {
		for _, tc := range []struct {
			ctx  func() (context.Context, context.CancelFunc)
			want error
		}{
			{func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx, cancel
			}, context.Canceled},
			{func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(200*time.Millisecond, cancel)
				return ctx, cancel
			}, context.Canceled},
			{func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 200*time.Millisecond)
			}, context.DeadlineExceeded},
		} {
			ctx, cancel := tc.ctx()
			done := make(chan error, 1)
			go func() { done <- open(ctx) }()
			select {
			case err := <-done:
				if !errors.Is(err, tc.want) {
					t.Errorf("%s: %v, want an error matching %v", name, err, tc.want)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("%s: still waiting 10s after its context (%v) ended", name, tc.want)
			}
			cancel()
		}
	}
}
