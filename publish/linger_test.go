package publish_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/publish"
)

// Linger: a key's first batch waits for more of the key, up to Linger or
// until MaxBatch, so keys published round robin go in one request each.
// Without it the first batch goes at once (with whatever had queued).
func TestLingerFillsTheFirstBatch(t *testing.T) {
	for _, tc := range []struct {
		name      string
		linger    time.Duration
		maxBatch  int
		oneBatch  bool          // each key's three messages in one batch
		firstSent time.Duration // when the first batch is sent
	}{
		{"off", 0, 100, false, 0},
		{"waits", 5 * time.Millisecond, 100, true, 5 * time.Millisecond},
		{"full batch goes at once", time.Hour, 3, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p, st, _ := stepSetup(t, &publish.Config{Linger: tc.linger, MaxBatch: tc.maxBatch})
				start := time.Now()
				ctx := context.Background()
				var rs []*publish.Result
				// Two keys, round robin: A0 B0 A1 B1 A2 B2.
				for _, m := range []string{"A0", "B0", "A1", "B1", "A2", "B2"} {
					rs = append(rs, p.PublishAsync(ctx, &keyorder.Message{Key: m[:1], Payload: []byte(m)}))
				}
				batches := map[string][][]string{}
				var first time.Duration
				for n := 0; n < 6; {
					s := <-st.steps // blocking: the fake clock runs out the linger
					if n == 0 {
						first = time.Since(start)
					}
					k := s.payloads[0][:1]
					batches[k] = append(batches[k], s.payloads)
					n += len(s.payloads)
					s.reply <- nil
				}
				st.idle(t)
				for _, r := range rs {
					if _, err := r.Get(ctx); err != nil {
						t.Fatal(err)
					}
				}
				for _, k := range []string{"A", "B"} {
					if got, want := slices.Concat(batches[k]...), []string{k + "0", k + "1", k + "2"}; !slices.Equal(got, want) {
						t.Fatalf("key %s sent %v, want %v in order", k, batches[k], want)
					}
					if tc.oneBatch && len(batches[k]) != 1 {
						t.Fatalf("key %s sent %v, want one batch", k, batches[k])
					}
				}
				if first != tc.firstSent {
					t.Fatalf("first batch sent after %v, want %v", first, tc.firstSent)
				}
			})
		})
	}
}

func TestLingerNegative(t *testing.T) {
	if _, err := publish.New(nil, &publish.Config{Linger: -time.Second}); !errors.Is(err, keyorder.ErrInvalidConfig) {
		t.Fatalf("Linger -1s: %v, want ErrInvalidConfig", err)
	}
}

// Close ends a linger at once: what lingers is sent before Close returns,
// well within Close's deadline (a Close that waited out the hour would
// return the deadline's error), and nothing is lost.
func TestCloseEndsLinger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, p, s := setup(t, &publish.Config{Linger: time.Hour})
		ctx := context.Background()
		r1 := p.PublishAsync(ctx, &keyorder.Message{Key: "k", Payload: []byte("m1")})
		r2 := p.PublishAsync(ctx, &keyorder.Message{Key: "k", Payload: []byte("m2")})
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := p.Close(cctx); err != nil {
			t.Fatalf("Close with a 1s deadline over a 1h linger = %v, want nil (sent at once)", err)
		}
		for _, r := range []*publish.Result{r1, r2} {
			if !settled(r) {
				t.Fatal("a lingering message was not settled when Close returned")
			}
			if _, err := r.Get(ctx); err != nil {
				t.Fatalf("lingering message: %v", err)
			}
		}
		if got := payloads(receiveAll(t, s)); !slices.Equal(got, []string{"m1", "m2"}) {
			t.Fatalf("broker got %v, want [m1 m2]", got)
		}
	})
}

// When the send of what lingered does not finish before Close's deadline,
// Close returns the deadline's error and the message's Result reports
// ErrClosed: never a silent loss. The linger still ended when Close
// started: the send began before any time passed.
func TestCloseDeadlineDuringLingerFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _, s := setup(t, nil)
		g := &gatedTopic{Topic: memhook.Of(b).TopicDriver("t"), entered: make(chan string, 10), release: make(chan struct{})}
		p, err := publish.New(g, &publish.Config{Linger: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		r := p.PublishAsync(ctx, &keyorder.Message{Key: "k", Payload: []byte("m1")})
		synctest.Wait()
		select {
		case m := <-g.entered:
			t.Fatalf("%s sent before Close while lingering", m)
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		closed := make(chan error, 1)
		go func() { closed <- p.Close(cctx) }()
		synctest.Wait()
		select {
		case <-g.entered:
		default:
			t.Fatal("Close started, yet the lingering batch was not sent")
		}
		if err := <-closed; !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Close = %v, want DeadlineExceeded", err)
		}
		if !settled(r) {
			t.Fatal("the message was not settled when Close returned")
		}
		if _, err := r.Get(ctx); !errors.Is(err, keyorder.ErrClosed) {
			t.Fatalf("message unsent at Close's deadline = %v, want ErrClosed", err)
		}
		rctx, cancelReceive := context.WithTimeout(ctx, time.Second)
		defer cancelReceive()
		if got, _ := s.Receive(rctx, 10); len(got) != 0 {
			t.Fatalf("broker got %v", payloads(got))
		}
	})
}
