package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/publish"
)

// headerList is a repeatable --header k=v flag.
type headerList map[string]string

func (h headerList) String() string { return fmt.Sprint(map[string]string(h)) }
func (h headerList) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("want k=v, got %q", v)
	}
	h[k] = val
	return nil
}

// maxStdin bounds the payload read from standard input.
const maxStdin = 64 << 20

func (c *cli) publish(ctx context.Context, args []string) error {
	fs := c.flags("publish")
	key := fs.String("key", "", "the message's ordering `KEY`")
	id := fs.String("id", "", "message `ID` (default: a new UUID)")
	delay := fs.Duration("delay", 0, "deliver not before now + `D` (a duration: 90s, 5m)")
	headers := headerList{}
	fs.Var(headers, "header", "header `k=v` (repeatable)")
	pos, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	raw, err := c.oneURL("publish", pos)
	if err != nil {
		return err
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	// Read as the command's context allows: a writer that stalls (a pipe
	// never closed) must not keep the command past --timeout or an
	// interrupt.
	payload, err := interruptible(ctx, func() ([]byte, error) {
		return io.ReadAll(io.LimitReader(c.stdin, maxStdin+1))
	})
	if err != nil {
		return fmt.Errorf("read payload from standard input: %w", err)
	}
	if len(payload) > maxStdin {
		return usagef("publish: payload on standard input exceeds %d bytes", maxStdin)
	}
	pub, err := publish.Open(ctx, raw, nil)
	if err != nil {
		return err
	}
	m := &keyorder.Message{ID: *id, Key: *key, Payload: payload}
	if len(headers) > 0 {
		m.Headers = headers
	}
	if *delay > 0 {
		m.NotBefore = time.Now().Add(*delay)
	}
	sentID, perr := pub.Publish(ctx, m)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := pub.Close(cctx); err != nil && perr == nil {
		perr = err
	}
	if perr != nil {
		return fmt.Errorf("publish: %w", perr)
	}
	if c.json {
		return c.emitJSON(map[string]any{"id": sentID, "key": m.Key, "bytes": len(payload)})
	}
	c.printf("published %s (key %q, %d bytes)\n", sentID, m.Key, len(payload))
	return nil
}
