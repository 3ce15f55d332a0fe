package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"strings"
	"text/tabwriter"

	"github.com/keyorder/keyorder"
)

// statsJSON is what stats prints with --json. A count the backend cannot
// report is -1.
type statsJSON struct {
	URL           string `json:"url"`
	Backend       string `json:"backend"`
	Ordering      string `json:"ordering"`
	NativeHold    bool   `json:"native_hold"`
	LeaseDuration string `json:"lease_duration"`
	MaxBatch      int    `json:"max_batch"`
	MaxAttempts   int    `json:"max_attempts,omitempty"`
	MinBackoff    string `json:"min_backoff,omitempty"`
	MaxBackoff    string `json:"max_backoff,omitempty"`
	// Pending counts messages not yet acknowledged or dead-lettered.
	Pending int64 `json:"pending"`
	Dead    int   `json:"dead"`
	// Keys counts keys with something pending or in flight.
	Keys int64 `json:"keys"`
	Held int   `json:"held"`
	// Superseded counts messages a compacting subscription resolved
	// without delivering them (a newer message of the key was delivered).
	Superseded int64 `json:"superseded"`
	// Unknown lists what the backend cannot report.
	Unknown []string `json:"unknown"`
}

func (c *cli) stats(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("stats", flag.ContinueOnError)
	pos, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	raw, err := c.oneURL("stats", pos)
	if err != nil {
		return err
	}
	sub, err := c.openSub(ctx, raw)
	if err != nil {
		return err
	}
	defer closeSub(ctx, sub)
	caps := sub.Capabilities()
	out := statsJSON{
		URL: c.redact(raw), Ordering: caps.Ordering.String(), NativeHold: caps.NativeHold,
		LeaseDuration: caps.LeaseDuration.String(), MaxBatch: caps.MaxBatch,
		Pending: keyorder.Unknown, Dead: -1, Keys: keyorder.Unknown, Held: -1,
	}
	if u, err := url.Parse(raw); err == nil {
		out.Backend = u.Scheme
	}
	if r := caps.Retry; r != nil {
		out.MaxAttempts, out.MinBackoff, out.MaxBackoff = r.MaxAttempts, r.MinBackoff.String(), r.MaxBackoff.String()
	}
	st, err := sub.Stats(ctx)
	if err != nil {
		return fmt.Errorf("stats: %w", err)
	}
	if b := st.Backend; b != nil {
		out.Pending, out.Dead, out.Keys, out.Held = b.Pending, int(b.Dead), b.Keys, int(b.HeldKeys)
		out.Superseded = b.Superseded
	}
	if out.Dead < 0 {
		// The backend does not count them: list them, where it can.
		dls, err := sub.DeadLetters(ctx, 0)
		if err != nil && !errors.Is(err, keyorder.ErrUnsupported) {
			return fmt.Errorf("count dead letters: %w", err)
		}
		if err == nil {
			out.Dead = len(dls)
		}
	}
	if out.Held < 0 {
		keys, err := sub.HeldKeys(ctx, 0)
		if err != nil && !errors.Is(err, keyorder.ErrUnsupported) {
			return fmt.Errorf("count held keys: %w", err)
		}
		if err == nil {
			out.Held = len(keys)
		}
	}
	for _, u := range []struct {
		name    string
		unknown bool
	}{{"pending", out.Pending < 0}, {"dead", out.Dead < 0}, {"keys", out.Keys < 0}, {"held", out.Held < 0}} {
		if u.unknown {
			out.Unknown = append(out.Unknown, u.name)
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
		row("retry (stored)", fmt.Sprintf("max attempts %d, backoff %s..%s (0: the consumer's setting)", out.MaxAttempts, out.MinBackoff, out.MaxBackoff))
	} else {
		row("retry (stored)", "none: each consumer's subscribe.Config.Retry")
	}
	if out.Dead >= 0 {
		row("dead letters", fmt.Sprint(out.Dead))
	} else {
		row("dead letters", "not listable on this backend")
	}
	if out.Held >= 0 {
		row("held keys", fmt.Sprintf("%d (in flight or waiting on a retry or delay; keyorder held URL lists them)", out.Held))
	} else {
		row("held keys", "not listable on this backend")
	}
	if out.Pending >= 0 {
		row("pending", fmt.Sprintf("%d (not yet acknowledged or dead-lettered, in flight included)", out.Pending))
		row("keys", fmt.Sprintf("%d (with something pending or in flight)", out.Keys))
	} else {
		row("pending, keys", "not reported by this backend")
	}
	if out.Superseded > 0 {
		row("superseded", fmt.Sprintf("%d (compaction: resolved without delivery, a newer message of the key was delivered)", out.Superseded))
	}
	tw.Flush()
	c.printf("%s", b.String())
	return nil
}
