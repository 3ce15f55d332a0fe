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
	"github.com/keyorder/keyorder/adapters"
)

// statsJSON is what stats prints with --json. Dead is -1 when the backend
// keeps no dead letters it can list.
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
	Dead          int    `json:"dead"`
	// Held is -1 when the backend cannot list held keys.
	Held int `json:"held"`
	// Unknown lists what the backend's driver cannot report through the
	// portable API.
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
	drv, err := adapters.DefaultMux().OpenSubscription(ctx, raw)
	if err != nil {
		return err
	}
	defer drv.Close()
	caps := drv.Capabilities()
	out := statsJSON{
		URL: c.redact(raw), Ordering: caps.Ordering.String(), NativeHold: caps.NativeHold,
		LeaseDuration: caps.LeaseDuration.String(), MaxBatch: caps.MaxBatch, Dead: -1,
		Held: -1, Unknown: []string{"backlog", "in_flight"},
	}
	if u, err := url.Parse(raw); err == nil {
		out.Backend = u.Scheme
	}
	if r := caps.Retry; r != nil {
		out.MaxAttempts, out.MinBackoff, out.MaxBackoff = r.MaxAttempts, r.MinBackoff.String(), r.MaxBackoff.String()
	}
	if st, ok := drv.(adapters.DeadLetterStore); ok {
		dls, err := st.DeadLetters(ctx, 0)
		if err != nil && !errors.Is(err, keyorder.ErrUnsupported) {
			return fmt.Errorf("count dead letters: %w", err)
		}
		if err == nil {
			out.Dead = len(dls)
		}
	}
	if out.Dead < 0 {
		out.Unknown = append(out.Unknown, "dead")
	}
	if hl, ok := drv.(heldLister); ok {
		keys, err := hl.HeldKeys(ctx, 0)
		if err != nil {
			return fmt.Errorf("count held keys: %w", err)
		}
		out.Held = len(keys)
	} else {
		out.Unknown = append(out.Unknown, "held")
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
	row("backlog, in flight", "not reported: the driver interface has no counters yet")
	tw.Flush()
	c.printf("%s", b.String())
	return nil
}
