// Command testenv starts the real servers keyorder's tests run against —
// PostgreSQL, Google's Pub/Sub emulator, ElasticMQ (SQS), a Pulsar
// standalone broker, a Kafka broker (KRaft) and a NATS server with JetStream
// — on 127.0.0.1, and stops them
// again.
//
//	testenv run [--only postgres,pubsub,sqs,pulsar,kafka,nats] [--keep] -- <command...>
//	    Start the servers, run the command with their settings in its
//	    environment (plus KEYORDER_TESTENV=1 when all servers run), stop the
//	    servers when it ends (also on failure, SIGINT or SIGTERM) and exit with
//	    the command's exit code.
//
//	testenv up [--only ...] [--keep]
//	    Start the servers, write `export NAME=value` lines to .testenv/env in
//	    the repository root and print them, and stay in the foreground until
//	    Ctrl-C or SIGTERM. In another shell: `. .testenv/env; go test ./...`.
//
// Run it from inside the repository (it finds the root by its go.mod).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/keyorder/keyorder/internal/testenv"
)

func usage() {
	fmt.Fprint(os.Stderr, `usage:
  testenv run [--only postgres,pubsub,sqs,pulsar,kafka,nats] [--keep] [--start-timeout D] -- <command...>
  testenv up  [--only postgres,pubsub,sqs,pulsar,kafka,nats] [--keep] [--start-timeout D]

Servers: postgres (PostgreSQL), pubsub (Google's Pub/Sub emulator),
sqs (ElasticMQ), pulsar (Pulsar standalone), kafka (Kafka broker and
controller in one KRaft node; KEYORDER_KAFKA_BROKERS=127.0.0.1:PORT),
nats (nats-server with JetStream, built from its Go module once;
KEYORDER_NATS_URL=nats://127.0.0.1:PORT).
Default: all.
Extra Maven arguments can be given in KEYORDER_MVN_ARGS.
`)
}

func main() {
	stopWithGoRun()
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	switch os.Args[1] {
	case "run":
		os.Exit(run(os.Args[2:]))
	case "up":
		os.Exit(up(os.Args[2:]))
	case "-h", "--help", "help":
		usage()
	default:
		fmt.Fprintf(os.Stderr, "testenv: unknown mode %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
}

type config struct {
	names        []string
	all          bool
	keep         bool
	startTimeout time.Duration
}

func parseFlags(mode string, args []string) (config, []string, error) {
	fs := flag.NewFlagSet("testenv "+mode, flag.ContinueOnError)
	fs.Usage = usage
	only := fs.String("only", "", "comma-separated servers to start (default: all)")
	keep := fs.Bool("keep", false, "keep the servers' data directory and logs after stopping")
	st := fs.Duration("start-timeout", 0, "readiness timeout per server (default: per server, 60s-180s)")
	if err := fs.Parse(args); err != nil {
		return config{}, nil, err
	}
	names, err := testenv.ParseServers(*only)
	if err != nil {
		return config{}, nil, err
	}
	c := config{names: names, keep: *keep, startTimeout: *st}
	c.all = len(names) == len(testenv.AllServers)
	return c, fs.Args(), nil
}

// start starts the servers; a signal during start-up cancels it (and stops
// whatever had started).
func start(c config, sigs <-chan os.Signal) (*testenv.Env, os.Signal, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got os.Signal
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		select {
		case s := <-sigs:
			got = s
			fmt.Fprintf(os.Stderr, "testenv: %v during start-up, stopping servers\n", s)
			cancel()
		case <-done:
		}
	}()
	began := time.Now()
	fmt.Fprintf(os.Stderr, "testenv: starting %s\n", strings.Join(testenv.SortedNames(c.names), ", "))
	e, err := testenv.Start(ctx, testenv.Options{StartTimeout: c.startTimeout}, c.names, c.keep)
	close(done)
	<-finished
	if err == nil && got != nil {
		// The signal came just as the last server became ready.
		_ = e.Stop()
		return nil, got, fmt.Errorf("%v during start-up", got)
	}
	if err == nil {
		fmt.Fprintf(os.Stderr, "testenv: all servers ready in %.1fs\n%s", time.Since(began).Seconds(), indent(e.Report()))
	}
	return e, got, err
}

func run(args []string) int {
	c, rest, err := parseFlags("run", args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 2
	}
	if len(rest) == 0 {
		fmt.Fprintln(os.Stderr, "testenv run: no command given (testenv run [flags] -- <command...>)")
		return 2
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)

	e, sig, err := start(c, sigs)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv: could not start the servers:\n%v\n", err)
		if sig != nil {
			return 128 + int(sig.(syscall.Signal))
		}
		return 1
	}
	code := runChild(rest, childEnv(e, c), sigs)
	stopped := time.Now()
	if err := e.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: stopping servers: %v\n", err)
	}
	fmt.Fprintf(os.Stderr, "testenv: all servers stopped in %.1fs\n", time.Since(stopped).Seconds())
	return code
}

func childEnv(e *testenv.Env, c config) []string {
	env := os.Environ()
	// Drop any stale settings from the parent environment.
	drop := map[string]bool{testenv.EnvTestEnv: true}
	for _, k := range testenv.SettingVars {
		drop[k] = true
	}
	out := env[:0]
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); !drop[k] {
			out = append(out, kv)
		}
	}
	out = append(out, e.Settings.Environ()...)
	if c.all {
		// Every server runs: a test that finds none is broken, not skipped.
		out = append(out, testenv.EnvTestEnv+"=1")
	}
	return out
}

// runChild runs the command in its own process group, forwards signals to
// that group, and returns its exit code (128+signal if it was killed).
func runChild(argv []string, env []string, sigs <-chan os.Signal) int {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		return 127
	}
	pgid := cmd.Process.Pid
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	var killTimer <-chan time.Time
	var err error
loop:
	for {
		select {
		case err = <-waited:
			break loop
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "testenv: %v: passing it to the command, then stopping servers\n", s)
			_ = syscall.Kill(-pgid, s.(syscall.Signal))
			if killTimer == nil {
				killTimer = time.After(30 * time.Second)
			}
		case <-killTimer:
			fmt.Fprintln(os.Stderr, "testenv: command still running 30s after the signal: killing it")
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
	}
	// Whatever the command left in its group (e.g. test binaries) goes too.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
	return 1
}

func up(args []string) int {
	c, rest, err := parseFlags("up", args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 2
	}
	if len(rest) > 0 {
		fmt.Fprintf(os.Stderr, "testenv up: unexpected arguments %q\n", rest)
		return 2
	}
	root, err := testenv.FindRepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)

	e, sig, err := start(c, sigs)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv: could not start the servers:\n%v\n", err)
		if sig != nil {
			return 128 + int(sig.(syscall.Signal))
		}
		return 1
	}
	var b strings.Builder
	b.WriteString("# Written by `go run ./integration/cmd/testenv up`; valid while it runs.\n")
	for _, kv := range e.Settings.Vars() {
		fmt.Fprintf(&b, "export %s=%s\n", kv[0], shellQuote(kv[1]))
	}
	envDir := filepath.Join(root, ".testenv")
	envFile := filepath.Join(envDir, "env")
	code := 0
	if err := os.MkdirAll(envDir, 0o755); err == nil {
		err = os.WriteFile(envFile, []byte(b.String()), 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testenv:", err)
		}
	}
	fmt.Print(b.String())
	fmt.Fprintf(os.Stderr, "testenv: settings written to %s; in another shell:\n"+
		"    . .testenv/env; go test ./...\n"+
		"testenv: servers run until Ctrl-C or SIGTERM\n", envFile)
	s := <-sigs
	fmt.Fprintf(os.Stderr, "testenv: %v: stopping servers\n", s)
	_ = os.Remove(envFile)
	stopped := time.Now()
	if err := e.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: stopping servers: %v\n", err)
		code = 1
	}
	fmt.Fprintf(os.Stderr, "testenv: all servers stopped in %.1fs\n", time.Since(stopped).Seconds())
	return code
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

// stopWithGoRun makes this process receive SIGTERM when its parent dies if
// that parent is `go run`: go run ignores Ctrl-C (passing it on through the
// terminal) but dies on SIGTERM without passing that on, which would leave
// this launcher and its servers running.
func stopWithGoRun() {
	ppid := os.Getppid()
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", ppid))
	if err != nil || strings.TrimSpace(string(comm)) != "go" {
		return
	}
	const prSetPdeathsig = 1
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetPdeathsig, uintptr(syscall.SIGTERM), 0); errno != 0 {
		return
	}
	if os.Getppid() != ppid { // the parent died before prctl
		_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
	}
}
