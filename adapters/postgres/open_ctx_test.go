package postgres_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// blackhole returns the address of a local listener that accepts
// connections and never answers (a broker that hangs).
func blackhole(t *testing.T) string {
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

// checkOpenHonoursContext: publish.Open(topicURL) and
// subscribe.Open(subURL) return, with an error matching the context's, when
// their context is cancelled before or during the call or its 200ms
// deadline passes.
func checkOpenHonoursContext(t *testing.T, topicURL, subURL string) {
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

// TestOpenHonoursContext: opening against a server that hangs returns when
// the context ends.
func TestOpenHonoursContext(t *testing.T) {
	hangs := blackhole(t)
	u := "postgres://app:pw@" + hangs + "/db?topic=t&create=true"
	checkOpenHonoursContext(t, u, u+"&subscription=s")
}
