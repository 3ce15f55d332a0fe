package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/subscribe"
)

// openSub opens the subscription through the portable API (subscribe.Open),
// without running it: the CLI reads and redrives through the same
// Subscriber methods an application uses. Close it with closeSub.
func (c *cli) openSub(ctx context.Context, raw string) (*subscribe.Subscriber, error) {
	logger := slog.New(slog.NewTextHandler(cleanWriter{c}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return subscribe.Open(ctx, raw, &subscribe.Config{Logger: logger})
}

// closeSub releases a subscriber that never ran.
func closeSub(ctx context.Context, sub *subscribe.Subscriber) {
	sub.Close(context.WithoutCancel(ctx))
}

// deadJSON is a dead letter as --json prints it.
type deadJSON struct {
	ID       string            `json:"id"`
	Key      string            `json:"key"`
	Attempts int               `json:"attempts"`
	DeadAt   time.Time         `json:"dead_at"`
	Reason   string            `json:"reason"`
	Headers  map[string]string `json:"headers,omitempty"`
	Payload  string            `json:"payload"`
}

func toJSON(d keyorder.DeadLetter) deadJSON {
	return deadJSON{ID: d.Message.ID, Key: d.Message.Key, Attempts: d.Attempts, DeadAt: d.DeadAt.UTC(),
		Reason: d.Reason, Headers: userHeaders(d.Message.Headers), Payload: string(d.Message.Payload)}
}

// userHeaders returns h without the partition-key header (the key is
// printed on its own), or nil when nothing else is left.
func userHeaders(h map[string]string) map[string]string {
	if _, ok := h[keyorder.HeaderPartitionKey]; !ok {
		return h
	}
	out := maps.Clone(h)
	delete(out, keyorder.HeaderPartitionKey)
	if len(out) == 0 {
		return nil
	}
	return out
}

// printable returns p quoted and cut to max runes when it is not short
// plain text.
func printable(p []byte, max int) string {
	s := string(p)
	if !utf8.ValidString(s) {
		return fmt.Sprintf("<%d bytes, binary>", len(p))
	}
	if utf8.RuneCountInString(s) > max {
		s = string([]rune(s)[:max]) + "…"
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

func (c *cli) emitJSON(v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	c.printf("%s\n", b)
	return nil
}

func (c *cli) deadList(ctx context.Context, args []string) error {
	fs := c.flags("dead list")
	limit := fs.Int("limit", 100, "list at most `N` dead letters (0: all)")
	pos, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	raw, err := c.oneURL("dead list", pos)
	if err != nil {
		return err
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	st, err := c.openSub(ctx, raw)
	if err != nil {
		return err
	}
	defer closeSub(ctx, st)
	dls, err := st.DeadLetters(ctx, *limit)
	if err != nil {
		return fmt.Errorf("list dead letters: %w", err)
	}
	if c.json {
		out := make([]deadJSON, 0, len(dls))
		for _, d := range dls {
			out = append(out, toJSON(d))
		}
		return c.emitJSON(out)
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKEY\tATTEMPTS\tDEAD AT\tREASON\tPAYLOAD")
	for _, d := range dls {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", d.Message.ID, printable([]byte(d.Message.Key), 40), d.Attempts,
			d.DeadAt.UTC().Format(time.RFC3339), printable([]byte(d.Reason), 60), printable(d.Message.Payload, 40))
	}
	tw.Flush()
	c.printf("%s", b.String())
	more := ""
	if *limit > 0 && len(dls) == *limit {
		more = fmt.Sprintf(" (the first %d; --limit 0 lists all)", *limit)
	}
	c.eprintf("%d dead letters%s\n", len(dls), more)
	return nil
}

// idList is a repeatable --id flag; each value may hold several IDs
// separated by commas.
type idList []string

func (l *idList) String() string { return strings.Join(*l, ",") }
func (l *idList) Set(v string) error {
	for _, id := range strings.Split(v, ",") {
		if id = strings.TrimSpace(id); id != "" {
			*l = append(*l, id)
		}
	}
	return nil
}

func (c *cli) deadShow(ctx context.Context, args []string) error {
	fs := c.flags("dead show")
	var ids idList
	fs.Var(&ids, "id", "show the dead letter with this message `ID` (repeatable, or comma-separated)")
	pos, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	raw, err := c.oneURL("dead show", pos)
	if err != nil {
		return err
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	if len(ids) == 0 {
		return usagef("dead show: --id is required")
	}
	st, err := c.openSub(ctx, raw)
	if err != nil {
		return err
	}
	defer closeSub(ctx, st)
	dls, err := st.DeadLetters(ctx, 0)
	if err != nil {
		return fmt.Errorf("list dead letters: %w", err)
	}
	var found []keyorder.DeadLetter
	for _, d := range dls {
		if slices.Contains(ids, d.Message.ID) {
			found = append(found, d)
		}
	}
	if c.json {
		out := make([]deadJSON, 0, len(found))
		for _, d := range found {
			out = append(out, toJSON(d))
		}
		if err := c.emitJSON(out); err != nil {
			return err
		}
	} else {
		for i, d := range found {
			if i > 0 {
				c.printf("\n")
			}
			c.printf("id:        %s\nkey:       %s\nattempts:  %d\ndead at:   %s\nreason:    %s\n",
				d.Message.ID, d.Message.Key, d.Attempts, d.DeadAt.UTC().Format(time.RFC3339Nano), d.Reason)
			h := userHeaders(d.Message.Headers)
			for _, k := range slices.Sorted(maps.Keys(h)) {
				c.printf("header:    %s=%s\n", k, h[k])
			}
			c.printf("payload:   %s\n", printable(d.Message.Payload, 1<<20))
		}
	}
	if len(found) < len(ids) {
		return fmt.Errorf("%d of %d IDs are not dead letters of this subscription: %w", len(ids)-len(found), len(ids), keyorder.ErrNotFound)
	}
	return nil
}

// redriveBatch is how many IDs one Redrive call carries; progress is
// reported after each.
const redriveBatch = 100

func (c *cli) deadRedrive(ctx context.Context, args []string) error {
	fs := c.flags("dead redrive")
	var ids idList
	fs.Var(&ids, "id", "redrive the dead letter with this message `ID` (repeatable, or comma-separated)")
	all := fs.Bool("all", false, "redrive every dead letter (asks for confirmation; --timeout counts the wait)")
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	pos, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	raw, err := c.oneURL("dead redrive", pos)
	if err != nil {
		return err
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	if *all == (len(ids) > 0) {
		return usagef("dead redrive: give --id ID (repeatable) or --all")
	}
	st, err := c.openSub(ctx, raw)
	if err != nil {
		return err
	}
	defer closeSub(ctx, st)
	if *all {
		dls, err := st.DeadLetters(ctx, 0)
		if err != nil {
			return fmt.Errorf("list dead letters: %w", err)
		}
		for _, d := range dls {
			ids = append(ids, d.Message.ID)
		}
		if len(ids) == 0 {
			c.eprintf("no dead letters\n")
			return c.redriveResult(0, 0)
		}
		if !*yes {
			c.eprintf("redrive all %d dead letters of %s? They go back after everything published meanwhile. [y/N] ", len(ids), c.redact(raw))
			line, err := c.readLine(ctx)
			if err != nil {
				return err
			}
			if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
				return errDeclined
			}
		}
	}
	done := 0
	var missing []string // IDs that are not dead letters
	for i := 0; i < len(ids); i += redriveBatch {
		part := ids[i:min(i+redriveBatch, len(ids))]
		n, err := st.Redrive(ctx, part)
		done += n
		var nd *keyorder.NotDeadLetterError
		if errors.As(err, &nd) {
			// The others of the batch were redriven: go on.
			missing, err = append(missing, nd.IDs...), nil
		}
		if err != nil {
			return fmt.Errorf("redrive (%d of %d redriven before the error): %w", done, len(ids), err)
		}
		if len(ids) > redriveBatch {
			c.eprintf("\r%s", progress(i+len(part), len(ids), done))
		}
	}
	if len(ids) > redriveBatch {
		c.eprintf("\n")
	}
	if err := c.redriveResult(done, len(ids)); err != nil {
		return err
	}
	if len(missing) > 0 {
		return &keyorder.NotDeadLetterError{IDs: missing} // "redriven N of M" is printed
	}
	if done < len(ids) {
		return fmt.Errorf("%d of %d IDs were not dead letters of this subscription: %w", len(ids)-done, len(ids), keyorder.ErrNotFound)
	}
	return nil
}

// readLine reads the answer to a prompt from stdin, unless ctx (the
// --timeout, an interrupt) ends first.
func (c *cli) readLine(ctx context.Context) (string, error) {
	line, err := interruptible(ctx, func() (string, error) {
		line, _ := bufio.NewReader(c.stdin).ReadString('\n')
		return line, nil
	})
	if err != nil {
		c.eprintf("\n")
		return "", fmt.Errorf("confirmation: %w", err)
	}
	return line, nil
}

// interruptible returns what read returns, unless ctx ends first: then it
// returns ctx's cause (the --timeout, an interrupt) and leaves read behind,
// blocked on standard input, which no context can unblock; the process is
// about to exit.
func interruptible[T any](ctx context.Context, read func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := read()
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, context.Cause(ctx)
	}
}

func (c *cli) redriveResult(done, asked int) error {
	if c.json {
		return c.emitJSON(map[string]int{"redriven": done, "asked": asked})
	}
	c.printf("redriven %d of %d\n", done, asked)
	return nil
}

// progress draws a bar for a redrive: asked IDs sent so far of total.
func progress(sent, total, done int) string {
	const width = 30
	fill := width * sent / max(total, 1)
	return fmt.Sprintf("[%s%s] %d/%d sent, %d redriven", strings.Repeat("#", fill), strings.Repeat(".", width-fill), sent, total, done)
}
