package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"text/tabwriter"

	"github.com/keyorder/keyorder"
)

// statsJSON is what stats --json prints: one object of the same shape on
// every backend. Every field is always present. A figure the backend
// cannot report is null (never omitted, never -1), and its name is listed
// in Unknown; a figure that is known is a number or a string, 0 included.
//
// What each backend reports today: PostgreSQL every field. Pub/Sub, SQS,
// Pulsar, Kafka and NATS: dead (counted by listing the dead-letter topic,
// queue or stream); pending, keys, held and superseded are null (SQS hides
// a held group's messages; Pub/Sub, Pulsar, Kafka and NATS hold keys
// inside the consuming process);
// max_attempts, min_backoff and max_backoff are null (no retry policy is
// stored with the subscription: each consumer's subscribe.Config.Retry
// applies).
type statsJSON struct {
	// URL is the subscription URL, secrets redacted.
	URL string `json:"url"`
	// Backend is the URL's scheme: postgres, pubsub, sqs, pulsar, kafka or nats.
	Backend string `json:"backend"`
	// Ordering is the subscription's policy: unordered, exclusive or
	// ordered.
	Ordering string `json:"ordering"`
	// NativeHold is true when the broker holds a failed key itself,
	// false when the subscriber holds it in process.
	NativeHold bool `json:"native_hold"`
	// LeaseDuration is how long a received message stays leased without
	// being extended, as a Go duration ("30s"); "0s" when the driver keeps
	// leases alive by itself.
	LeaseDuration string `json:"lease_duration"`
	// MaxBatch is the most messages one receive returns (at least 1).
	MaxBatch int `json:"max_batch"`
	// MaxAttempts, MinBackoff and MaxBackoff are the retry policy stored
	// with the subscription (0 or "0s": the subscription leaves it to the
	// consumer); null when the backend stores none.
	MaxAttempts *int    `json:"max_attempts"`
	MinBackoff  *string `json:"min_backoff"`
	MaxBackoff  *string `json:"max_backoff"`
	// Pending counts messages not yet acknowledged or dead-lettered, in
	// flight included.
	Pending *int64 `json:"pending"`
	// Dead counts dead letters kept where they can be listed.
	Dead *int64 `json:"dead"`
	// Keys counts keys with something pending or in flight.
	Keys *int64 `json:"keys"`
	// Held counts keys that cannot be delivered now: in flight, or
	// waiting on a retry or a publish delay.
	Held *int64 `json:"held"`
	// Superseded counts messages a compacting subscription resolved
	// without delivering them (a newer message of the key was delivered);
	// 0 on a subscription that does not compact.
	Superseded *int64 `json:"superseded"`
	// Unknown names the fields that are null, in the order above; [] when
	// the backend reports everything.
	Unknown []string `json:"unknown"`
}

// known returns a pointer to n, or nil when n is keyorder.Unknown.
func known(n int64) *int64 {
	if n < 0 {
		return nil
	}
	return &n
}

func (c *cli) stats(ctx context.Context, args []string) error {
	fs := c.flags("stats")
	pos, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	raw, err := c.oneURL("stats", pos)
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
	caps := sub.Capabilities()
	out := statsJSON{
		URL: c.redact(raw), Ordering: caps.Ordering.String(), NativeHold: caps.NativeHold,
		LeaseDuration: caps.LeaseDuration.String(), MaxBatch: max(caps.MaxBatch, 1),
		Unknown: []string{},
	}
	if u, err := url.Parse(raw); err == nil {
		out.Backend = u.Scheme
	}
	if r := caps.Retry; r != nil {
		minB, maxB := r.MinBackoff.String(), r.MaxBackoff.String()
		out.MaxAttempts, out.MinBackoff, out.MaxBackoff = &r.MaxAttempts, &minB, &maxB
	}
	st, err := sub.Stats(ctx)
	if err != nil {
		return err
	}
	if b := st.Backend; b != nil {
		out.Pending, out.Dead, out.Keys, out.Held = known(b.Pending), known(b.Dead), known(b.Keys), known(b.HeldKeys)
		out.Superseded = known(b.Superseded)
	}
	if out.Dead == nil {
		// The backend does not count them: list them, where it can.
		dls, err := sub.DeadLetters(ctx, 0)
		if err != nil && !errors.Is(err, keyorder.ErrUnsupported) {
			return fmt.Errorf("count dead letters: %w", err)
		}
		if err == nil {
			out.Dead = known(int64(len(dls)))
		}
	}
	if out.Held == nil {
		keys, err := sub.HeldKeys(ctx, 0)
		if err != nil && !errors.Is(err, keyorder.ErrUnsupported) {
			return fmt.Errorf("count held keys: %w", err)
		}
		if err == nil {
			out.Held = known(int64(len(keys)))
		}
	}
	for _, f := range []struct {
		name    string
		unknown bool
	}{
		{"max_attempts", out.MaxAttempts == nil}, {"min_backoff", out.MinBackoff == nil}, {"max_backoff", out.MaxBackoff == nil},
		{"pending", out.Pending == nil}, {"dead", out.Dead == nil}, {"keys", out.Keys == nil},
		{"held", out.Held == nil}, {"superseded", out.Superseded == nil},
	} {
		if f.unknown {
			out.Unknown = append(out.Unknown, f.name)
		}
	}
	if c.json {
		return c.emitJSON(out)
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("subscription", out.URL)
	row("backend", out.Backend)
	row("ordering", out.Ordering)
	hold := "in process (the subscriber holds a failed key)"
	if out.NativeHold {
		hold = "broker (the broker holds a failed key)"
	}
	row("hold", hold)
	row("lease", out.LeaseDuration)
	row("max batch", fmt.Sprint(out.MaxBatch))
	if caps.Retry != nil {
		row("retry (stored)", fmt.Sprintf("max attempts %d, backoff %s..%s (0: the consumer's setting)", *out.MaxAttempts, *out.MinBackoff, *out.MaxBackoff))
	} else {
		row("retry (stored)", "none: each consumer's subscribe.Config.Retry")
	}
	if out.Dead != nil {
		row("dead letters", fmt.Sprint(*out.Dead))
	} else {
		row("dead letters", "not listable on this backend")
	}
	if out.Held != nil {
		row("held keys", fmt.Sprintf("%d (in flight or waiting on a retry or delay; keyorder held URL lists them)", *out.Held))
	} else {
		row("held keys", "not listable on this backend")
	}
	if out.Pending != nil {
		row("pending", fmt.Sprintf("%d (not yet acknowledged or dead-lettered, in flight included)", *out.Pending))
	} else {
		row("pending", "not reported by this backend")
	}
	if out.Keys != nil {
		row("keys", fmt.Sprintf("%d (with something pending or in flight)", *out.Keys))
	} else {
		row("keys", "not reported by this backend")
	}
	if out.Superseded != nil && *out.Superseded > 0 {
		row("superseded", fmt.Sprintf("%d (compaction: resolved without delivery, a newer message of the key was delivered)", *out.Superseded))
	}
	tw.Flush()
	c.printf("%s", b.String())
	return nil
}
