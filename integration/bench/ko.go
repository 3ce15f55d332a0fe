package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/lanes"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// koDriver is what keyorder needs of a backend: a topic driver, a way to
// open consumers of its subscription (which exists already, so nothing
// published is missed), and a cleanup.
type koDriver struct {
	openPub func(ctx context.Context, cfg *publish.Config) (*publish.Publisher, error)
	openSub func(ctx context.Context, cfg *subscribe.Config) (*subscribe.Subscriber, error)
	cleanup func()
}

// koFactory creates a fresh topic and Ordered subscription named after id.
type koFactory func(ctx context.Context, id string) (*koDriver, error)

// Publishing modes of keyorder's Publisher.
const (
	modePublish = "Publish"      // one goroutine per key, Publish per message
	modeBatch   = "PublishBatch" // a few goroutines, each owning a share of the keys
	modeAsync   = "PublishAsync" // one goroutine, every message in order, then every Result
)

// linger is publish.Config.Linger for every keyorder system (-linger).
var linger = flag.Duration("linger", 0, "publish.Config.Linger of keyorder's publishers (0: send at once)")

// koTuning is per-backend tuning of keyorder's portable layer.
type koTuning struct {
	publish   publish.Config
	subscribe subscribe.Config
	// publishers is how many goroutines call PublishBatch (modeBatch),
	// chunk how many messages each call carries.
	publishers, chunk int
}

// koSystems returns keyorder's systems on a backend, one per publishing
// mode.
func koSystems(f koFactory, t koTuning) []system {
	var out []system
	for _, mode := range []string{modePublish, modeBatch, modeAsync} {
		out = append(out, system{
			name: "keyorder " + mode,
			open: func(ctx context.Context, id string) (endpoint, error) {
				d, err := f(ctx, id)
				if err != nil {
					return nil, err
				}
				pc := t.publish
				pc.Logger = quiet()
				pc.Linger = *linger
				p, err := d.openPub(ctx, &pc)
				if err != nil {
					d.cleanup()
					return nil, err
				}
				return &koEndpoint{d: d, pub: p, mode: mode, t: t}, nil
			},
		})
	}
	return out
}

type koEndpoint struct {
	d    *koDriver
	pub  *publish.Publisher
	mode string
	t    koTuning
}

func (e *koEndpoint) publish(ctx context.Context, w *workload) error {
	var wg sync.WaitGroup
	errs := make(chan error, len(w.keys))
	switch e.mode {
	case modePublish:
		for _, idx := range w.byKey() {
			wg.Go(func() {
				for _, i := range idx {
					if _, err := e.pub.Publish(ctx, &keyorder.Message{Key: w.key(i), Payload: w.payloads[i]}); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	case modeBatch:
		n := max(e.t.publishers, 1)
		shares := make([][]*keyorder.Message, n)
		for i := range w.n() {
			s := w.msgKey[i] % n
			shares[s] = append(shares[s], &keyorder.Message{Key: w.key(i), Payload: w.payloads[i]})
		}
		for _, share := range shares {
			wg.Go(func() {
				for c := range slices.Chunk(share, max(e.t.chunk, 1)) {
					if _, err := e.pub.PublishBatch(ctx, c); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	case modeAsync:
		rs := make([]*publish.Result, w.n())
		for i := range w.n() {
			rs[i] = e.pub.PublishAsync(ctx, &keyorder.Message{Key: w.key(i), Payload: w.payloads[i]})
		}
		for _, r := range rs {
			if _, err := r.Get(ctx); err != nil {
				return err
			}
		}
		return nil
	default:
		return fmt.Errorf("unknown publishing mode %q", e.mode)
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// lanesNote describes keyorder's workers for a table's note: n (or
// -workers) workers of the -assign assignment, the subscriber's default
// (lanes.Shared) when not given.
func lanesNote(n int) string {
	if koWorkers > 0 {
		n = koWorkers
	}
	if koAssign == "bykey" {
		return fmt.Sprintf("%d keyed lanes (lanes.ByKey)", n)
	}
	return fmt.Sprintf("%d workers on one shared lane (lanes.Shared, the default)", n)
}

func (e *koEndpoint) consume(ctx context.Context, chk *orderCheck) error {
	sc := e.t.subscribe
	sc.Logger = quiet()
	if koWorkers > 0 {
		sc.Workers = koWorkers
	}
	switch koAssign {
	case "":
	case "bykey":
		sc.Assign = lanes.ByKey
	case "shared":
		sc.Assign = lanes.Shared
	default:
		return fmt.Errorf("-assign %q: want bykey or shared", koAssign)
	}
	s, err := e.d.openSub(ctx, &sc)
	if err != nil {
		return err
	}
	defer s.Close(context.Background())
	return s.Run(ctx, func(_ context.Context, d *keyorder.Delivery) error {
		if handlerWork > 0 {
			time.Sleep(handlerWork)
		}
		chk.see(d.Payload)
		return nil
	})
}

func (e *koEndpoint) close() {
	_ = e.pub.Close(context.Background())
	e.d.cleanup()
}

// quiet is the logger of the clients under test: errors only.
func quiet() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}
