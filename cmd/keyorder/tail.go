package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/subscribe"
)

// tailJSON is one message as tail --json prints it (one JSON object a
// line).
type tailJSON struct {
	ID          string            `json:"id"`
	Key         string            `json:"key"`
	Attempt     int               `json:"attempt"`
	PublishTime time.Time         `json:"publish_time,omitzero"`
	Headers     map[string]string `json:"headers,omitempty"`
	Payload     string            `json:"payload"`
}

func (c *cli) tail(ctx context.Context, args []string) error {
	fs := c.flags("tail")
	count := fs.Int("count", 0, "stop after `N` messages (0: no limit)")
	dur := fs.Duration("for", 0, "stop, successfully, after `DURATION` (0: no limit)")
	pos, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	raw, err := c.oneURL("tail", pos)
	if err != nil {
		return err
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	if *dur > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *dur)
		defer cancel()
	}
	logger := slog.New(slog.NewTextHandler(cleanWriter{c}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// One worker: messages print in the order they are handled, and the
	// count stops exactly.
	sub, err := subscribe.Open(ctx, raw, &subscribe.Config{Workers: 1, MaxOutstanding: 1, ShutdownTimeout: time.Second, Logger: logger})
	if err != nil {
		return err
	}
	// The deferred Close releases the subscription; when the count stopped
	// the subscriber, that Close did it and this one returns ErrClosed.
	defer sub.Close(context.WithoutCancel(ctx))
	var n atomic.Int64
	var once sync.Once
	var mu sync.Mutex
	runErr := sub.Run(ctx, func(hctx context.Context, d *keyorder.Delivery) error {
		if *count > 0 && n.Load() >= int64(*count) {
			// Past the count, while shutting down: wait for the shutdown
			// to cancel the handler, so the subscriber returns the message
			// to the broker unhandled (no attempt counted).
			<-hctx.Done()
			return hctx.Err()
		}
		mu.Lock()
		if c.json {
			b, _ := json.Marshal(tailJSON{ID: d.ID, Key: d.Key, Attempt: d.Attempt, PublishTime: d.PublishTime.UTC(),
				Headers: d.Headers, Payload: string(d.Payload)})
			c.printf("%s\n", b)
		} else {
			c.printf("%s  key=%s  id=%s  attempt=%d  %s\n", time.Now().UTC().Format(time.RFC3339Nano),
				printable([]byte(d.Key), 80), d.ID, d.Attempt, printable(d.Payload, 200))
		}
		mu.Unlock()
		if *count > 0 && n.Add(1) >= int64(*count) {
			once.Do(func() { go sub.Close(context.WithoutCancel(ctx)) })
		}
		return nil
	})
	if runErr != nil {
		return runErr
	}
	// Run returns nil when its context ends: --for ends a tail, --timeout
	// fails it (unless the count was reached first).
	var te *timeoutError
	if errors.As(context.Cause(ctx), &te) && (*count == 0 || n.Load() < int64(*count)) {
		return fmt.Errorf("tail: %d messages: %w", n.Load(), te)
	}
	return nil
}

// cleanWriter writes logs to stderr through clean.
type cleanWriter struct{ c *cli }

func (w cleanWriter) Write(p []byte) (int, error) {
	w.c.eprintf("%s", p)
	return len(p), nil
}
