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
//	keyorder stats URL [--json]
//	keyorder held URL                   (PostgreSQL)
//	keyorder publish URL --key acct-42 [--header k=v]... [--id ID] < payload
//	keyorder tail URL [--count N] [--for 30s]
//	keyorder version                    (or keyorder --version)
//
// URL is a subscription URL (a topic URL for publish), exactly as
// subscribe.Open and publish.Open take it; the binary registers the
// PostgreSQL, Pub/Sub, SQS, Pulsar, Kafka and NATS schemes. It refuses mem:// URLs: the
// in-memory broker lives inside one process, and this command, a process of
// its own, would always find it empty. Output is a table by default and
// JSON with --json. Secrets in the URL (a password, and query parameters
// such as password, secret or token) are redacted in every line the command
// prints, errors included.
//
// Every command takes -h or --help (its usage and flags, on standard
// output) and --timeout, which bounds the whole command, the broker calls and
// a confirmation prompt included (default 30s; 0 for none; tail has no
// timeout unless given one). --timeout may also come before the command:
// keyorder --timeout 2m dead redrive URL --all.
//
// # Exit codes
//
//	0  done
//	1  the operation failed (the broker returned an error, or --timeout passed)
//	2  usage error (unknown command or flag, missing or malformed argument,
//	   a mem:// URL)
//	3  the backend cannot do it (keyorder.ErrUnsupported)
//	4  not found (a subscription, topic or dead letter)
//	5  not confirmed (a redrive of everything was declined)
//	130  interrupted (SIGINT); 143 for SIGTERM
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/keyorder/keyorder"
	_ "github.com/keyorder/keyorder/adapters/kafka"
	_ "github.com/keyorder/keyorder/adapters/nats"
	_ "github.com/keyorder/keyorder/adapters/postgres"
	_ "github.com/keyorder/keyorder/adapters/pubsub"
	_ "github.com/keyorder/keyorder/adapters/pulsar"
	_ "github.com/keyorder/keyorder/adapters/sqs"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/suggest"
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

// defaultTimeout bounds a command unless --timeout says otherwise. tail
// runs until its --count, its --for or an interrupt instead.
const defaultTimeout = 30 * time.Second

func main() {
	ctx, stop := notifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	c := &cli{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr}
	// What the libraries log on the default logger (a client's warnings)
	// goes through the redaction, each message once: the Pulsar client
	// logs "Failed to connect to broker" several times a second while a
	// broker does not answer.
	slog.SetDefault(slog.New(newOnceHandler(slog.NewTextHandler(cleanWriter{c}, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	code := c.run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

// onceHandler passes a record on only the first time its level and
// message are seen.
type onceHandler struct {
	slog.Handler
	mu   *sync.Mutex
	seen map[string]bool
}

func newOnceHandler(h slog.Handler) onceHandler {
	return onceHandler{Handler: h, mu: new(sync.Mutex), seen: map[string]bool{}}
}

// Handle implements slog.Handler.
func (h onceHandler) Handle(ctx context.Context, r slog.Record) error {
	k := r.Level.String() + " " + r.Message
	h.mu.Lock()
	seen := h.seen[k]
	h.seen[k] = true
	h.mu.Unlock()
	if seen {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

// WithAttrs implements slog.Handler; the derived handler shares what was
// seen.
func (h onceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return onceHandler{h.Handler.WithAttrs(as), h.mu, h.seen}
}

// WithGroup implements slog.Handler.
func (h onceHandler) WithGroup(name string) slog.Handler {
	return onceHandler{h.Handler.WithGroup(name), h.mu, h.seen}
}

// interrupted is the cause of the command's context when a signal ended
// it; run then exits 128 + the signal's number.
type interrupted struct{ sig syscall.Signal }

func (e *interrupted) Error() string {
	switch e.sig {
	case syscall.SIGINT:
		return "interrupted (SIGINT)"
	case syscall.SIGTERM:
		return "interrupted (SIGTERM)"
	}
	return fmt.Sprintf("interrupted (signal %d)", int(e.sig))
}

// notifyContext is signal.NotifyContext with the signal as a cause run can
// read (signal.NotifyContext's cause only describes it). After the first
// signal the process has its default handling back, so a second one ends
// a command that does not stop (a broker call that ignores its context).
func notifyContext(parent context.Context, sigs ...os.Signal) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	go func() {
		select {
		case s := <-ch:
			signal.Stop(ch)
			sig, _ := s.(syscall.Signal)
			cancel(&interrupted{sig})
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		cancel(nil)
	}
}

// command describes a command for its --help.
type command struct {
	name     string // as typed: "dead list"
	synopsis string // the arguments after the name
	short    string // what it does, a few words
	about    string // what it does, a few lines
}

// commands lists the commands in the order the top-level usage shows them.
var commands = []command{
	{"dead list", "URL [--limit N] [--json]", "list dead letters",
		"List the subscription's dead letters: ID, key, attempts, when, why, payload."},
	{"dead show", "URL --id ID [--id ID]... [--json]", "print dead letters in full",
		"Print dead letters in full: headers, reason and payload. Exit 4 when an ID\nis not a dead letter of the subscription."},
	{"dead redrive", "URL (--id ID [--id ID]... | --all [--yes]) [--json]", "return dead letters to the subscription",
		"Return dead letters to the subscription; they are delivered again after\neverything published meanwhile. --all asks for confirmation unless --yes."},
	{"stats", "URL [--json]", "print a subscription's settings and counts",
		"Print the subscription's settings and the counts its backend reports:\npending, dead letters, keys, held keys, superseded. --json prints the same\nobject on every backend; a count the backend cannot report is null."},
	{"held", "URL [--limit N] [--json]", "list held keys (PostgreSQL)",
		"List the keys the backend holds (in flight, or waiting on a retry or a\npublish delay). PostgreSQL only; other backends exit 3."},
	{"publish", "URL --key KEY [--header k=v]... [--id ID] [--delay D] [--json] < payload", "publish standard input as one message",
		"Publish standard input as one message to the topic URL."},
	{"tail", "URL [--count N] [--for DURATION] [--json]", "print and acknowledge a subscription's messages",
		"Consume the subscription and print each message, acknowledging it. Runs\nuntil --count messages, --for, --timeout or an interrupt; no timeout by default."},
	{"version", "[--json]", "print the version",
		"Print the version of keyorder (the module version, \"(devel)\" when built\nfrom a checkout without one) and of Go it was built with."},
}

func lookup(name string) (command, bool) {
	i := slices.IndexFunc(commands, func(c command) bool { return c.name == name })
	if i < 0 {
		return command{}, false
	}
	return commands[i], true
}

// topUsage is what keyorder --help prints.
func topUsage() string {
	var b strings.Builder
	b.WriteString("keyorder operates keyorder subscriptions and topics from a shell.\n\nusage: keyorder [--timeout D] COMMAND URL [flags]\n\ncommands:\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-13s %s\n", c.name, c.short)
	}
	b.WriteString(`
flags:
  --timeout D   bound the whole command (default 30s; 0: none; tail: none)
  --version     print the version (keyorder version)
  -h, --help    this text; keyorder COMMAND --help shows a command's flags

URL is a subscription URL (a topic URL for publish), one of
  ` + schemeList() + `.
Exit codes: 0 done, 1 failed, 2 usage, 3 unsupported by the backend,
4 not found, 5 declined.
`)
	return b.String()
}

// brokerSchemes returns the schemes this binary registers, mem excluded
// (refused: see errMemURL), sorted. The help and the errors name them from
// the registry, so that a backend added to the imports is named everywhere.
func brokerSchemes() []string {
	return slices.DeleteFunc(driver.DefaultMux().SubscriptionSchemes(), func(s string) bool { return s == "mem" })
}

// schemeList returns "a://, b:// or c://" of brokerSchemes.
func schemeList() string {
	s := brokerSchemes()
	for i := range s {
		s[i] += "://"
	}
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// cli is one invocation: its streams and the secrets to keep out of them.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	json           bool
	secrets        []string // raw strings replaced in everything printed

	// timeout bounds the command (0: none); timeoutSet records that the
	// operator gave it before the command.
	timeout    time.Duration
	timeoutSet bool
	// allowMem accepts mem:// URLs. Only tests set it: they run the CLI in
	// the process that holds the in-memory broker.
	allowMem bool
	// cmd is the command being run ("" before one is known), for hints.
	cmd string
	// cmdCtx is the command's context once bound by --timeout.
	cmdCtx context.Context
	// rawURL is the command's URL argument, once given.
	rawURL string
}

// usageError is a command-line mistake (exit 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// errDeclined: the operator declined a confirmation (exit 5).
var errDeclined = errors.New("not confirmed; nothing done")

// errHelp: a --help was printed (exit 0).
var errHelp = errors.New("help printed")

// errMemURL refuses a mem:// URL.
func errMemURL() error {
	return usagef("%s", "mem:// URLs name an in-memory broker that lives inside one process: "+
		"this command runs in a process of its own and would always find it empty. "+
		"Give a "+schemeList()+" URL")
}

// timeoutError is the cause of a command context's deadline.
type timeoutError struct{ d time.Duration }

func (e *timeoutError) Error() string {
	return fmt.Sprintf("timed out after %s (--timeout; 0 for none)", e.d)
}

// run runs one invocation and returns its exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr}
	return c.run(ctx, args)
}

func (c *cli) run(ctx context.Context, args []string) int {
	c.timeout = defaultTimeout
	err := c.dispatch(ctx, args)
	if errors.Is(err, errHelp) {
		err = nil
	}
	var in *interrupted
	if errors.As(context.Cause(ctx), &in) {
		// Whatever the command made of it: tail stops successfully, a
		// broker call fails with context.Canceled.
		if err != nil {
			if !errors.As(err, new(*interrupted)) {
				err = fmt.Errorf("%w: %w", in, err)
			}
			fmt.Fprintln(c.stderr, "keyorder: "+c.message(err))
		}
		return 128 + int(in.sig)
	}
	if err == nil {
		return exitOK
	}
	if c.cmdCtx != nil {
		err = timedOut(c.cmdCtx, err)
	}
	err = c.unreachable(ctx, c.rawURL, err)
	code := exitFailure
	var ue *usageError
	switch {
	case errors.As(err, &ue), errors.Is(err, keyorder.ErrBadURL), errors.Is(err, keyorder.ErrUnknownScheme):
		code = exitUsage
	case errors.Is(err, errDeclined):
		code = exitDeclined
	case errors.Is(err, keyorder.ErrUnsupported):
		code = exitUnsupported
	case errors.Is(err, keyorder.ErrNotFound):
		code = exitNotFound
	}
	fmt.Fprintln(c.stderr, "keyorder: "+c.message(err))
	if code == exitUsage {
		if c.cmd != "" {
			fmt.Fprintf(c.stderr, "Run 'keyorder %s --help' for its usage.\n", c.cmd)
		} else {
			fmt.Fprintln(c.stderr, "Run 'keyorder --help' for the commands.")
		}
	}
	return code
}

// message is err as printed after "keyorder: ": redacted, without the
// "keyorder: " the library's errors start with (the prefix is printed
// once, not once per wrapping layer).
func (c *cli) message(err error) string {
	m := c.clean(err.Error())
	m = strings.TrimPrefix(m, "keyorder: ")
	return strings.ReplaceAll(m, ": keyorder: ", ": ")
}

func (c *cli) dispatch(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("keyorder", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.DurationVar(&c.timeout, "timeout", defaultTimeout, "")
	showVersion := fs.Bool("version", false, "")
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version") {
		// keyorder --version [--json]: the version command.
		return c.version(args[1:])
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(c.stdout, topUsage())
			return errHelp
		}
		if m := flagErrRE.FindStringSubmatch(err.Error()); m != nil && strings.HasPrefix(m[1], "flag provided") && slices.Contains(commandFlags(), m[len(m)-2]) {
			return usagef("unknown flag %s before the command: it is a flag of the commands (keyorder COMMAND URL %s)", dashed(m[len(m)-2]), dashed(m[len(m)-2]))
		}
		return flagError(fs, err)
	}
	fs.Visit(func(f *flag.Flag) { c.timeoutSet = c.timeoutSet || f.Name == "timeout" })
	args = fs.Args()
	if *showVersion {
		// keyorder --version [--json]: the version command.
		return c.version(args)
	}
	if len(args) == 0 {
		return usagef("no command")
	}
	switch args[0] {
	case "dead":
		c.cmd = "dead"
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
		case "-h", "-help", "--help", "help":
			c.printHelp("dead list", "dead show", "dead redrive")
			return errHelp
		}
		return usagef("dead: unknown subcommand %q%s (want list, show or redrive)", args[1], didYouMean(args[1], []string{"list", "show", "redrive"}))
	case "stats":
		return c.stats(ctx, args[1:])
	case "held":
		return c.held(ctx, args[1:])
	case "publish":
		return c.publish(ctx, args[1:])
	case "tail":
		return c.tail(ctx, args[1:])
	case "version":
		return c.version(args[1:])
	case "help":
		// keyorder help [COMMAND...]
		if len(args) == 1 {
			fmt.Fprint(c.stdout, topUsage())
			return errHelp
		}
		return c.dispatch(ctx, append(args[1:], "--help"))
	}
	if strings.HasPrefix(args[0], "-") {
		// A flag after the command's place: keyorder --timeout 1s --json.
		return usagef("unknown flag %s before the command%s", dashed(args[0]), didYouMean(args[0], []string{"--timeout", "--version", "--help"}))
	}
	return usagef("unknown command %q%s", args[0], didYouMean(args[0], topNames()))
}

// commandFlags returns the names of the flags the commands' synopses
// show.
func commandFlags() []string {
	var names []string
	for _, cmd := range commands {
		for _, m := range synopsisFlagRE.FindAllStringSubmatch(cmd.synopsis, -1) {
			if !slices.Contains(names, m[1]) {
				names = append(names, m[1])
			}
		}
	}
	return names
}

var synopsisFlagRE = regexp.MustCompile(`--(\w+)`)

// topNames returns the first words of the commands, and help.
func topNames() []string {
	var names []string
	for _, c := range commands {
		n, _, _ := strings.Cut(c.name, " ")
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return append(names, "help")
}

// didYouMean returns ` (did you mean "x"?)` for the candidate closest to
// name, "" when none is close.
func didYouMean(name string, candidates []string) string {
	if s := suggest.Closest(name, candidates); s != "" {
		return fmt.Sprintf(" (did you mean %q?)", s)
	}
	return ""
}

// dashed spells a flag as the help does: --name (single-letter flags keep
// one dash, -h).
func dashed(arg string) string {
	name := strings.TrimLeft(arg, "-")
	name, _, _ = strings.Cut(name, "=")
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// flagErrRE matches the flag package's errors, which spell every flag
// with one dash (-timeout).
var flagErrRE = regexp.MustCompile(`^(flag provided but not defined:|flag needs an argument:|invalid value "(?s:.*)" for flag|invalid boolean value "(?s:.*)" for) -(\S+)(:.*)?$`)

// flagError rewrites an error of fs.Parse as the help spells flags
// (--timeout, not -timeout), suggesting a flag of fs close to an unknown
// one.
func flagError(fs *flag.FlagSet, err error) error {
	prefix := ""
	if fs.Name() != "keyorder" {
		prefix = fs.Name() + ": "
	}
	m := flagErrRE.FindStringSubmatch(err.Error())
	if m == nil {
		return usagef("%s%v", prefix, err)
	}
	name, rest := m[len(m)-2], m[len(m)-1]
	switch {
	case m[1] == "flag provided but not defined:":
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		hint := ""
		if s := suggest.Closest(name, names); s != "" {
			hint = fmt.Sprintf(" (did you mean %s?)", dashed(s))
		}
		return usagef("%sunknown flag %s%s", prefix, dashed(name), hint)
	case m[1] == "flag needs an argument:":
		return usagef("%sflag %s needs a value", prefix, dashed(name))
	}
	return usagef("%s%s %s%s", prefix, strings.TrimSuffix(m[1], " -"), dashed(name), rest)
}

// printHelp prints the named commands' usage, without their flags (keyorder
// dead --help).
func (c *cli) printHelp(names ...string) {
	for i, n := range names {
		cmd, _ := lookup(n)
		if i > 0 {
			fmt.Fprintln(c.stdout)
		}
		fmt.Fprintf(c.stdout, "usage: keyorder %s %s\n\n%s\n", cmd.name, cmd.synopsis, cmd.about)
	}
	fmt.Fprintf(c.stdout, "\nRun 'keyorder %s --help' for a command's flags.\n", names[0])
}

// flags returns the flag set of a command, with the flags every command
// takes: --json and (but version) --timeout.
func (c *cli) flags(name string) *flag.FlagSet {
	c.cmd = name
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.BoolVar(&c.json, "json", false, "print JSON")
	if name == "version" {
		return fs
	}
	def, what := c.timeout, "fail when the command takes longer than `D` (0: none)"
	if name == "tail" && !c.timeoutSet {
		def, what = 0, "fail when the tail takes longer than `D` (0: none; --for ends a tail without failing)"
	}
	fs.DurationVar(&c.timeout, "timeout", def, what)
	return fs
}

// parse parses flags and positional arguments in any order (flags may
// follow the URL) and returns the positional ones. On -h or --help it
// prints the command's usage and flags to stdout and returns errHelp.
func (c *cli) parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				c.printFlags(fs)
				return nil, errHelp
			}
			return nil, flagError(fs, err)
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// printFlags prints a command's usage and its flags with their
// descriptions.
func (c *cli) printFlags(fs *flag.FlagSet) {
	cmd, _ := lookup(fs.Name())
	var b strings.Builder
	fmt.Fprintf(&b, "usage: keyorder %s %s\n\n%s\n\nflags:\n", cmd.name, cmd.synopsis, cmd.about)
	fs.VisitAll(func(f *flag.Flag) {
		typ, what := flag.UnquoteUsage(f)
		name := "--" + f.Name
		if typ != "" {
			name += " " + typ
		}
		if !slices.Contains([]string{"", "0", "0s", "false", "map[]"}, f.DefValue) {
			what += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(&b, "  %-20s %s\n", name, what)
	})
	fmt.Fprintf(&b, "  %-20s %s\n", "-h, --help", "print this help")
	fmt.Fprint(c.stdout, b.String())
}

// bound returns ctx bounded by --timeout, for a command to run in once its
// arguments are parsed. After the command fails, run says when the
// timeout caused it (see timedOut).
func (c *cli) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.timeout <= 0 {
		return context.WithCancel(ctx)
	}
	var cancel context.CancelFunc
	c.cmdCtx, cancel = context.WithTimeoutCause(ctx, c.timeout, &timeoutError{c.timeout})
	return c.cmdCtx, cancel
}

// timedOut returns err, marked as the --timeout's doing when ctx's
// deadline passed.
func timedOut(ctx context.Context, err error) error {
	var te *timeoutError
	if err == nil || !errors.As(context.Cause(ctx), &te) || errors.As(err, &te) {
		return err
	}
	return fmt.Errorf("%w: %w", te, err)
}

// oneURL parses the single positional argument, a URL, and registers its
// secrets for redaction. It refuses mem:// URLs.
func (c *cli) oneURL(name string, pos []string) (string, error) {
	if len(pos) != 1 {
		return "", usagef("%s: want exactly one URL argument, got %d", name, len(pos))
	}
	c.addSecrets(pos[0])
	c.rawURL = pos[0]
	u, err := url.Parse(pos[0])
	if err == nil && strings.EqualFold(u.Scheme, "mem") && !c.allowMem {
		return "", errMemURL()
	}
	if err == nil && u.Scheme != "" && !(c.allowMem && u.Scheme == "mem") && !slices.Contains(brokerSchemes(), u.Scheme) {
		// The library's error asks a programmer whether an import was
		// forgotten; the operator can only change the URL.
		hint := ""
		if s := suggest.Closest(u.Scheme, brokerSchemes()); s != "" {
			hint = fmt.Sprintf(" (did you mean %s://?)", s)
		}
		return "", usagef("%s: unknown URL scheme %q%s: keyorder opens %s URLs", name, u.Scheme, hint, schemeList())
	}
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

// shortSecret is the length under which a secret is replaced only where
// it stands alone (not inside a word): a value as short as "g" or "x" would
// otherwise be replaced inside every word of the message.
const shortSecret = 6

// clean replaces every registered secret in s, in one pass (a secret is
// never looked for in what replaced another). A secret shorter than
// shortSecret is replaced where no letter or digit touches it.
func (c *cli) clean(s string) string {
	var long []string
	var short []string
	for _, sec := range c.secrets {
		switch {
		case sec == "":
		case len(sec) < shortSecret:
			short = append(short, regexp.QuoteMeta(sec))
		default:
			long = append(long, sec, "xxxxx")
		}
	}
	if len(long) > 0 {
		s = strings.NewReplacer(long...).Replace(s) // c.secrets is longest first
	}
	if len(short) > 0 {
		re := regexp.MustCompile(`(^|[^\pL\pN])(?:` + strings.Join(short, "|") + `)($|[^\pL\pN])`)
		// A match consumes its right neighbour; two secrets in a row
		// ("k=a&b=a") need a second pass.
		for range 2 {
			s = re.ReplaceAllString(s, "${1}xxxxx${2}")
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
