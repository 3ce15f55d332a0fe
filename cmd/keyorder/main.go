// Command keyorder operates keyorder subscriptions and topics from a shell,
// on any backend by URL: list, show and redrive dead letters, print a
// subscription's state, publish a message and tail a subscription.
//
// When a key is stuck at 3 a.m. the operator should not have to write Go:
//
//	keyorder dead list  'postgres://ops@db/app?topic=ledger&subscription=apply-balance'
//	keyorder dead show  URL --id 0199...
//	keyorder dead redrive URL --id 0199... [--id ...]
//	keyorder dead redrive URL --all [--yes]
//	keyorder stats URL
//	keyorder held URL                   (PostgreSQL)
//	keyorder publish URL --key acct-42 [--header k=v]... [--id ID] < payload
//	keyorder tail URL [--count N] [--for 30s]
//
// URL is a subscription URL (a topic URL for publish), exactly as
// subscribe.Open and publish.Open take it; the binary registers the
// memory, PostgreSQL, Pub/Sub and SQS schemes. Output is a table by default
// and JSON with --json. Secrets in the URL (a password, and query
// parameters such as password, secret or token) are redacted in every line
// the command prints, errors included.
//
// # Exit codes
//
//	0  done
//	1  the operation failed (the broker returned an error)
//	2  usage error (unknown command or flag, missing argument)
//	3  the backend cannot do it (keyorder.ErrUnsupported)
//	4  not found (a subscription, topic or dead letter)
//	5  not confirmed (a redrive of everything was declined)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/keyorder/keyorder"
	_ "github.com/keyorder/keyorder/adapters/memory"
	_ "github.com/keyorder/keyorder/adapters/postgres"
	_ "github.com/keyorder/keyorder/adapters/pubsub"
	_ "github.com/keyorder/keyorder/adapters/pulsar"
	_ "github.com/keyorder/keyorder/adapters/sqs"
	"github.com/keyorder/keyorder/driver"
)

// Exit codes.
const (
	exitOK          = 0
	exitFailure     = 1
	exitUsage       = 2
	exitUnsupported = 3
	exitNotFound    = 4
	exitDeclined    = 5
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage:
  keyorder dead list URL [--limit N] [--json]
  keyorder dead show URL --id ID [--json]
  keyorder dead redrive URL (--id ID ... | --all [--yes]) [--json]
  keyorder stats URL [--json]
  keyorder held URL [--limit N] [--json]
  keyorder publish URL --key KEY [--header k=v]... [--id ID] [--json] < payload
  keyorder tail URL [--count N] [--for DURATION] [--json]
URL is a subscription URL (a topic URL for publish). Exit codes: 0 done,
1 failed, 2 usage, 3 unsupported by the backend, 4 not found, 5 declined.
`

// cli is one invocation: its streams and the secrets to keep out of them.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	json           bool
	secrets        []string // raw strings replaced in everything printed
}

// usageError is a command-line mistake (exit 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// errDeclined: the operator declined a confirmation (exit 5).
var errDeclined = errors.New("not confirmed; nothing done")

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr}
	err := c.dispatch(ctx, args)
	if err == nil {
		return exitOK
	}
	code := exitFailure
	var ue *usageError
	switch {
	case errors.As(err, &ue):
		code = exitUsage
	case errors.Is(err, errDeclined):
		code = exitDeclined
	case errors.Is(err, keyorder.ErrUnsupported):
		code = exitUnsupported
	case errors.Is(err, keyorder.ErrNotFound):
		code = exitNotFound
	}
	fmt.Fprintln(c.stderr, "keyorder: "+c.clean(err.Error()))
	if code == exitUsage {
		fmt.Fprint(c.stderr, usage)
	}
	return code
}

func (c *cli) dispatch(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usagef("no command")
	}
	switch args[0] {
	case "dead":
		if len(args) < 2 {
			return usagef("dead: want list, show or redrive")
		}
		switch args[1] {
		case "list":
			return c.deadList(ctx, args[2:])
		case "show":
			return c.deadShow(ctx, args[2:])
		case "redrive":
			return c.deadRedrive(ctx, args[2:])
		}
		return usagef("dead: unknown subcommand %q (want list, show or redrive)", args[1])
	case "stats":
		return c.stats(ctx, args[1:])
	case "held":
		return c.held(ctx, args[1:])
	case "publish":
		return c.publish(ctx, args[1:])
	case "tail":
		return c.tail(ctx, args[1:])
	case "help", "-h", "--help":
		fmt.Fprint(c.stdout, usage)
		return nil
	}
	return usagef("unknown command %q", args[0])
}

// parse parses flags and positional arguments in any order (flags may
// follow the URL) and returns the positional ones. --json is added to every
// flag set.
func (c *cli) parse(fs *flag.FlagSet, args []string) ([]string, error) {
	fs.SetOutput(io.Discard)
	fs.BoolVar(&c.json, "json", false, "print JSON")
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, usagef("%s: %v", fs.Name(), err)
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// oneURL parses the single positional argument, a URL, and registers its
// secrets for redaction.
func (c *cli) oneURL(name string, pos []string) (string, error) {
	if len(pos) != 1 {
		return "", usagef("%s: want exactly one URL argument, got %d", name, len(pos))
	}
	c.addSecrets(pos[0])
	return pos[0], nil
}

// addSecrets records what driver.Redact hides of raw (its password, the
// values of secret-looking and undeclared parameters, the whole string when
// it is not a URL), so clean removes them from anything printed, a broker's
// error message included.
func (c *cli) addSecrets(raw string) {
	c.secrets = append(c.secrets, driver.URLSecrets(raw)...)
	// Longest first, so that a secret inside another is not left half.
	slices.SortStableFunc(c.secrets, func(a, b string) int { return len(b) - len(a) })
}

// redact returns raw as it may be printed: driver.RedactString, the one
// redaction every backend's errors use, then clean.
func (c *cli) redact(raw string) string { return c.clean(driver.RedactString(raw)) }

// clean replaces every registered secret in s.
func (c *cli) clean(s string) string {
	for _, sec := range c.secrets {
		if len(sec) >= 1 {
			s = strings.ReplaceAll(s, sec, "xxxxx")
		}
	}
	return s
}

// printf writes to stdout through clean.
func (c *cli) printf(format string, args ...any) {
	fmt.Fprint(c.stdout, c.clean(fmt.Sprintf(format, args...)))
}

// eprintf writes to stderr through clean.
func (c *cli) eprintf(format string, args ...any) {
	fmt.Fprint(c.stderr, c.clean(fmt.Sprintf(format, args...)))
}
