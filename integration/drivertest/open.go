package drivertest

// The shared body of every adapter's test that publish.Open and
// subscribe.Open honour their context against a broker that hangs or is not
// there: an Open must return when its context ends, with an error matching
// the context's, whatever the client library does.

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// Unreachable returns the address of a local port nothing listens on.
func Unreachable(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// Blackhole returns the address of a local listener that accepts
// connections and never answers (a broker that hangs).
func Blackhole(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	return l.Addr().String()
}

// CheckOpenHonoursContext: publish.Open(topicURL) and
// subscribe.Open(subURL) return, with an error matching the context's, when
// their context is cancelled before or during the call or its 200ms
// deadline passes.
func CheckOpenHonoursContext(t *testing.T, topicURL, subURL string) {
	t.Helper()
	opens := map[string]func(ctx context.Context) error{
		"publish.Open": func(ctx context.Context) error {
			p, err := publish.Open(ctx, topicURL, nil)
			if err == nil {
				p.Close(context.Background())
			}
			return err
		},
		"subscribe.Open": func(ctx context.Context) error {
			s, err := subscribe.Open(ctx, subURL, nil)
			if err == nil {
				s.Close(context.Background())
			}
			return err
		},
	}
	for name, open := range opens {
		for _, tc := range []struct {
			what string
			ctx  func() (context.Context, context.CancelFunc)
			want error
		}{
			{"cancelled before", func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx, cancel
			}, context.Canceled},
			{"cancelled during", func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(200*time.Millisecond, cancel)
				return ctx, cancel
			}, context.Canceled},
			{"200ms deadline", func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 200*time.Millisecond)
			}, context.DeadlineExceeded},
		} {
			ctx, cancel := tc.ctx()
			done := make(chan error, 1)
			go func() { done <- open(ctx) }()
			select {
			case err := <-done:
				if !errors.Is(err, tc.want) {
					t.Errorf("%s, %s: %v, want an error matching %v", name, tc.what, err, tc.want)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("%s, %s: still waiting 10s after its context ended", name, tc.what)
			}
			cancel()
		}
	}
}
