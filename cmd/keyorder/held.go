package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/keyorder/keyorder"
)

// heldJSON is a held key as --json prints it.
type heldJSON struct {
	Key      string    `json:"key"`
	InFlight bool      `json:"in_flight"`
	Until    time.Time `json:"until"`
}

func (c *cli) held(ctx context.Context, args []string) error {
	fs := c.flags("held")
	limit := fs.Int("limit", 100, "list at most `N` keys (0: all)")
	pos, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	raw, err := c.oneURL("held", pos)
	if err != nil {
		return err
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	sub, err := c.openSub(ctx, raw)
	if err != nil {
		return err
	}
	defer closeSub(ctx, sub)
	keys, err := sub.HeldKeys(ctx, *limit)
	if errors.Is(err, keyorder.ErrUnsupported) {
		return fmt.Errorf("held keys of %s: only PostgreSQL can list them so far (SQS hides a held group's messages; "+
			"Pub/Sub, Pulsar, Kafka and NATS hold keys inside the consuming process): %w", c.redact(raw), keyorder.ErrUnsupported)
	}
	if err != nil {
		return fmt.Errorf("list held keys: %w", err)
	}
	if c.json {
		out := make([]heldJSON, 0, len(keys))
		for _, k := range keys {
			out = append(out, heldJSON{Key: k.Key, InFlight: k.InFlight, Until: k.Until.UTC()})
		}
		return c.emitJSON(out)
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSTATE\tUNTIL\tIN")
	now := time.Now()
	for _, k := range keys {
		state := "waiting (retry or publish delay)"
		if k.InFlight {
			state = "in flight (leased)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", printable([]byte(k.Key), 60), state, k.Until.UTC().Format(time.RFC3339), k.Until.Sub(now).Round(time.Second))
	}
	tw.Flush()
	c.printf("%s", b.String())
	c.eprintf("%d held keys\n", len(keys))
	return nil
}
