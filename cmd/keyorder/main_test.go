package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	_ "github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/internal/testenv"
	"github.com/keyorder/keyorder/subscribe"
)

// cmd runs the CLI in process. It accepts mem:// URLs: the in-memory
// broker lives in the test's process, which the CLI shares here.
func cmd(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := &cli{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errb, allowMem: true}
	code = c.run(ctx, args)
	return code, out.String(), errb.String()
}

// cmdAsShipped runs the CLI in process as the binary does (mem:// refused).
func cmdAsShipped(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code = run(ctx, args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

// Usage errors exit 2 with the error and a one-line hint on stderr, and
// nothing on stdout.
func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		hint string
	}{
		{nil, "keyorder --help"},
		{[]string{"nope"}, "keyorder --help"},
		{[]string{"--bogus", "stats"}, "keyorder --help"},
		{[]string{"--timeout", "soon", "stats"}, "keyorder --help"},
		{[]string{"dead"}, "keyorder dead --help"},
		{[]string{"dead", "purge", "mem://t?subscription=s"}, "keyorder dead --help"},
		{[]string{"dead", "list"}, "keyorder dead list --help"},
		{[]string{"dead", "list", "a", "b"}, "keyorder dead list --help"},
		{[]string{"dead", "redrive", "mem://t?subscription=s"}, "keyorder dead redrive --help"},
		{[]string{"dead", "redrive", "mem://t?subscription=s", "--all", "--id", "x"}, "keyorder dead redrive --help"},
		{[]string{"dead", "show", "mem://t?subscription=s"}, "keyorder dead show --help"},
		{[]string{"stats", "--bogus", "mem://t?subscription=s"}, "keyorder stats --help"},
		{[]string{"stats", "mem://t?subscription=s", "--timeout", "x"}, "keyorder stats --help"},
		{[]string{"held"}, "keyorder held --help"},
		{[]string{"publish", "--key"}, "keyorder publish --help"},
		{[]string{"publish", "mem://t", "--header", "nokv"}, "keyorder publish --help"},
		{[]string{"tail", "--count", "many", "mem://t?subscription=s"}, "keyorder tail --help"},
		{[]string{"version", "extra"}, "keyorder version --help"},
		{[]string{"stats", "mem://t?subscription=s&max_batch=x"}, "keyorder stats --help"},
		{[]string{"stats", "nosuchscheme://t?subscription=s"}, "keyorder stats --help"},
	} {
		code, stdout, stderr := cmd(t, "", tc.args...)
		lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
		if code != exitUsage || stdout != "" || len(lines) != 2 || !strings.HasPrefix(lines[0], "keyorder: ") ||
			lines[1] != "Run '"+tc.hint+"' for "+map[bool]string{true: "the commands.", false: "its usage."}[tc.hint == "keyorder --help"] {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit %d, an error line and the hint %q", tc.args, code, stdout, stderr, exitUsage, tc.hint)
		}
	}
}

// Every command's -h and --help print its usage with each of its flags and
// their descriptions to stdout, and exit 0; so do keyorder --help, -h and
// help, which list the commands.
func TestHelp(t *testing.T) {
	flags := map[string][]string{
		"dead list":    {"--limit N", "--json", "--timeout D"},
		"dead show":    {"--id ID", "--json", "--timeout D"},
		"dead redrive": {"--id ID", "--all", "--yes", "--json", "--timeout D"},
		"stats":        {"--json", "--timeout D"},
		"held":         {"--limit N", "--json", "--timeout D"},
		"publish":      {"--key KEY", "--id ID", "--delay D", "--header k=v", "--json", "--timeout D"},
		"tail":         {"--count N", "--for DURATION", "--json", "--timeout D"},
		"version":      {"--json"},
	}
	if len(flags) != len(commands) {
		t.Fatalf("%d commands, %d checked", len(commands), len(flags))
	}
	for name, want := range flags {
		for _, args := range [][]string{
			append(strings.Fields(name), "--help"),
			append(strings.Fields(name), "-h"),
			append(strings.Fields(name), "mem://t?subscription=s", "--json", "--help"),
			append([]string{"help"}, strings.Fields(name)...),
		} {
			code, stdout, stderr := cmd(t, "", args...)
			if code != exitOK || stderr != "" || !strings.HasPrefix(stdout, "usage: keyorder "+name+" ") || !strings.Contains(stdout, "-h, --help") {
				t.Errorf("%q: exit %d, stderr %q, stdout:\n%s", args, code, stderr, stdout)
				continue
			}
			for _, f := range want {
				// Each flag on a line of its own, with a description.
				i := strings.Index(stdout, "\n  "+f+" ")
				if i < 0 {
					t.Errorf("%q: no line for %s:\n%s", args, f, stdout)
					continue
				}
				line, _, _ := strings.Cut(stdout[i+3:], "\n")
				if len(strings.Fields(strings.TrimPrefix(line, f))) < 2 {
					t.Errorf("%q: %s has no description: %q", args, f, line)
				}
			}
			if name == "version" && strings.Contains(stdout, "--timeout") {
				t.Errorf("version offers --timeout:\n%s", stdout)
			}
		}
	}
	// The default timeout shows in the help, except for tail, which has none.
	if _, stdout, _ := cmd(t, "", "stats", "--help"); !strings.Contains(stdout, "(default 30s)") {
		t.Errorf("stats --help does not give the default timeout:\n%s", stdout)
	}
	if _, stdout, _ := cmd(t, "", "tail", "--help"); strings.Contains(stdout, "(default 30s)") {
		t.Errorf("tail --help gives a default timeout:\n%s", stdout)
	}
	if _, stdout, _ := cmd(t, "", "--timeout", "5m", "stats", "--help"); !strings.Contains(stdout, "(default 5m0s)") {
		t.Errorf("keyorder --timeout 5m stats --help does not give 5m as the default:\n%s", stdout)
	}
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"--timeout", "1s", "--help"}} {
		code, stdout, stderr := cmd(t, "", args...)
		if code != exitOK || stderr != "" || !strings.Contains(stdout, "usage: keyorder [--timeout D] COMMAND") || !strings.Contains(stdout, "--timeout D") {
			t.Errorf("%q: exit %d, stderr %q, stdout:\n%s", args, code, stderr, stdout)
		}
		for _, c := range commands {
			if !strings.Contains(stdout, "\n  "+c.name+" ") {
				t.Errorf("%q does not list %s:\n%s", args, c.name, stdout)
			}
		}
	}
	code, stdout, stderr := cmd(t, "", "dead", "--help")
	if code != exitOK || stderr != "" || !strings.Contains(stdout, "usage: keyorder dead list") ||
		!strings.Contains(stdout, "usage: keyorder dead show") || !strings.Contains(stdout, "usage: keyorder dead redrive") {
		t.Errorf("dead --help: exit %d, stderr %q, stdout:\n%s", code, stderr, stdout)
	}
}

// version prints the module version and the Go release.
func TestVersion(t *testing.T) {
	code, stdout, stderr := cmd(t, "", "version")
	if code != exitOK || stderr != "" || !strings.HasPrefix(stdout, "keyorder ") || !strings.Contains(stdout, "\ngo       "+runtime.Version()+"\n") {
		t.Errorf("version: exit %d, stderr %q, stdout:\n%s", code, stderr, stdout)
	}
	code, stdout, _ = cmd(t, "", "version", "--json")
	var v versionJSON
	if code != exitOK || json.Unmarshal([]byte(stdout), &v) != nil || v.Version == "" || v.Go != runtime.Version() {
		t.Errorf("version --json: exit %d\n%s", code, stdout)
	}
}

// mem:// URLs are refused with exit 2: another process never sees the
// in-memory broker's contents. The URL's secrets stay out of the message.
func TestMemRefused(t *testing.T) {
	for _, args := range [][]string{
		{"stats", "mem://t?subscription=s&token=t0psecret"},
		{"dead", "list", "MEM://t?subscription=s"},
		{"dead", "show", "mem://t?subscription=s", "--id", "x"},
		{"dead", "redrive", "mem://t?subscription=s", "--all", "--yes"},
		{"held", "mem://t?subscription=s"},
		{"publish", "mem://t", "--key", "k"},
		{"tail", "mem://t?subscription=s", "--for", "1s"},
	} {
		code, stdout, stderr := cmdAsShipped(t, args...)
		if code != exitUsage || stdout != "" || !strings.Contains(stderr, "in-memory broker") || !strings.Contains(stderr, "always find it empty") ||
			strings.Contains(stderr, "t0psecret") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and the refusal", args, code, stdout, stderr)
		}
	}
}

// Errors print with one "keyorder: " prefix, though the library's errors
// start with one and are wrapped.
func TestErrorPrefixOnce(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"stats", "sqs://q.fifo?lease=x"}, exitUsage},
		{[]string{"stats", "mem://t?subscription=s&max_batch=x"}, exitUsage},
		{[]string{"stats", "postgres://ops@127.0.0.1:1/db?topic=t&subscription=s&connect_timeout=1"}, exitFailure},
		{[]string{"dead", "redrive", "postgres://ops@127.0.0.1:1/db?topic=t&subscription=s&connect_timeout=1", "--id", "x"}, exitFailure},
	} {
		code, _, stderr := cmd(t, "", tc.args...)
		if code != tc.code || !strings.HasPrefix(stderr, "keyorder: ") || strings.Count(stderr, "keyorder:") != 1 {
			t.Errorf("%q: exit %d (want %d), stderr %q", tc.args, code, tc.code, stderr)
		}
	}
	c := &cli{}
	err := fmt.Errorf("count dead letters: %w", fmt.Errorf("keyorder: stats: %w", keyorder.ErrNotFound))
	if got := c.message(err); got != "count dead letters: stats: not found" {
		t.Errorf("message: %q", got)
	}
}

// --timeout bounds the whole command: a broker that accepts connections
// and never answers fails the command with exit 1 and says why.
func TestTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			cn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, cn) // held open, never answered
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, cn := range conns {
			cn.Close()
		}
	}()
	silent := "postgres://ops@" + ln.Addr().String() + "/db?topic=t&subscription=s"
	for _, args := range [][]string{
		{"stats", silent, "--timeout", "200ms"},
		{"--timeout", "200ms", "stats", silent},
		{"--timeout", "1h", "dead", "list", silent, "--timeout=200ms"},
		{"--timeout", "200ms", "publish", silent, "--key", "k"},
		{"--timeout", "200ms", "tail", silent},
	} {
		code, stdout, stderr := cmd(t, "x", args...)
		if code != exitFailure || stdout != "" || !strings.Contains(stderr, "timed out after 200ms (--timeout; 0 for none)") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 1 and the timeout", args, code, stdout, stderr)
		}
	}
	// tail: --timeout fails it, --for ends it.
	n := time.Now().UnixNano()
	sub := fmt.Sprintf("mem://cli-timeout-%d?subscription=s-%d", n, n)
	if code, _, stderr := cmd(t, "", "tail", sub, "--timeout", "200ms"); code != exitFailure || !strings.Contains(stderr, "tail: 0 messages: timed out after 200ms") {
		t.Errorf("tail --timeout: exit %d, stderr %q", code, stderr)
	}
	if code, _, stderr := cmd(t, "", "tail", sub, "--for", "200ms"); code != exitOK {
		t.Errorf("tail --for: exit %d, stderr %q", code, stderr)
	}
	// 0 means none.
	c := &cli{timeout: 0}
	ctx, cancel := c.bound(context.Background())
	defer cancel()
	if _, ok := ctx.Deadline(); ok {
		t.Error("--timeout 0 set a deadline")
	}
	c.timeout = time.Minute
	ctx, cancel = c.bound(context.Background())
	defer cancel()
	if d, ok := ctx.Deadline(); !ok || time.Until(d) > time.Minute {
		t.Errorf("--timeout 1m: deadline %v, %v", d, ok)
	}
}

// The binary itself: exit codes through os.Exit, help on stdout, the
// version the build recorded (as go version -m reads it), mem:// refused.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "keyorder")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	runBin := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		c := exec.Command(bin, args...)
		c.Stdout, c.Stderr = &out, &errb
		err := c.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return c.ProcessState.ExitCode(), out.String(), errb.String()
	}
	if code, stdout, stderr := runBin("--help"); code != 0 || stderr != "" || !strings.Contains(stdout, "commands:") {
		t.Errorf("--help: exit %d, stderr %q, stdout %q", code, stderr, stdout)
	}
	if code, stdout, stderr := runBin("stats", "--help"); code != 0 || stderr != "" || !strings.Contains(stdout, "--timeout D") {
		t.Errorf("stats --help: exit %d, stderr %q, stdout %q", code, stderr, stdout)
	}
	if code, _, stderr := runBin("nope"); code != 2 || !strings.HasSuffix(stderr, "Run 'keyorder --help' for the commands.\n") {
		t.Errorf("nope: exit %d, stderr %q", code, stderr)
	}
	if code, _, stderr := runBin("stats", "mem://t?subscription=s"); code != 2 || !strings.Contains(stderr, "in-memory broker") {
		t.Errorf("mem://: exit %d, stderr %q", code, stderr)
	}
	if code, _, stderr := runBin("stats", "postgres://ops@127.0.0.1:1/db?topic=t&subscription=s&connect_timeout=1"); code != 1 || strings.Count(stderr, "keyorder:") != 1 {
		t.Errorf("unreachable PostgreSQL: exit %d, stderr %q", code, stderr)
	}
	// A client library's retry warnings print once, redacted: the Pulsar
	// client warns on every failed connection, several times a second.
	if code, _, stderr := runBin("stats", "pulsar://"+closedPort(t)+"/a/b/t?subscription=s&token=t0psecret", "--timeout", "2s"); code != 1 ||
		strings.Count(stderr, "Failed to connect to broker") != 1 || !strings.Contains(stderr, "no Pulsar broker answered at ") || strings.Contains(stderr, "t0psecret") {
		t.Errorf("unreachable Pulsar: exit %d, stderr %q; want one warning and the broker named", code, stderr)
	}
	if code, stdout, stderr := runBin("--version"); code != 0 || stderr != "" || !strings.HasPrefix(stdout, "keyorder ") {
		t.Errorf("--version: exit %d, stderr %q, stdout %q", code, stderr, stdout)
	}
	m, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	var modVersion string
	for line := range strings.Lines(string(m)) {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "mod" && f[1] == "github.com/keyorder/keyorder/cmd/keyorder" {
			modVersion = f[2]
		}
	}
	code, stdout, _ := runBin("version")
	if code != 0 || modVersion == "" || !strings.HasPrefix(stdout, "keyorder "+modVersion+"\n") || !strings.Contains(stdout, "\ngo       go1.") {
		t.Errorf("version: exit %d, printed\n%s\nwant the module version %q (go version -m)", code, stdout, modVersion)
	}
	// A signal while publish waits for standard input (a pipe its writer
	// never closes, no --timeout) ends it with 128 + the signal's number.
	for _, tc := range []struct {
		sig  syscall.Signal
		code int
		msg  string
	}{
		{syscall.SIGINT, 130, "interrupted (SIGINT)"},
		{syscall.SIGTERM, 143, "interrupted (SIGTERM)"},
	} {
		signalPublish(t, bin, tc.sig, tc.code, tc.msg)
	}
}

// signalPublish starts bin's publish reading a pipe that never closes,
// sends the process sig once it is reading, and wants exit code and msg on
// stderr.
func signalPublish(t *testing.T, bin string, sig syscall.Signal, code int, msg string) {
	t.Helper()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pw.Close()
	var errb bytes.Buffer
	c := exec.Command(bin, "publish", "postgres://ops@127.0.0.1:1/db?topic=t", "--key", "k", "--timeout", "0")
	c.Stdin, c.Stderr = pr, &errb
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	pr.Close()
	exited := make(chan error, 1)
	go func() { exited <- c.Wait() }()
	// Once it has taken more than a pipe holds, it is reading: its signal
	// handling is set up.
	wrote := make(chan error, 1)
	go func() {
		_, err := pw.Write(make([]byte, 1<<20))
		wrote <- err
	}()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case err := <-exited:
		t.Fatalf("%v: publish exited before reading its standard input: %v\n%s", sig, err, errb.String())
	case <-time.After(time.Minute):
		c.Process.Kill()
		<-exited
		t.Fatalf("%v: publish did not read its standard input within a minute", sig)
	}
	if err := c.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(time.Minute):
		c.Process.Kill()
		<-exited
		t.Fatalf("%v: publish still reading its standard input a minute after the signal", sig)
	}
	if got := c.ProcessState.ExitCode(); got != code || !strings.Contains(errb.String(), "keyorder: read payload from standard input: "+msg) {
		t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", sig, got, errb.String(), code, msg)
	}
}

// publish reads standard input within --timeout and the command's context:
// a writer that never closes its pipe fails the command (exit 1 for the
// timeout, 130 for an interrupt) instead of keeping it running.
func TestPublishStdinStalled(t *testing.T) {
	n := time.Now().UnixNano()
	topic := fmt.Sprintf("mem://cli-stdin-%d", n)
	interrupt, cancel := context.WithCancelCause(context.Background())
	cancel(&interrupted{syscall.SIGINT})
	for _, tc := range []struct {
		ctx     context.Context
		timeout string
		code    int
		msg     string
	}{
		{context.Background(), "200ms", exitFailure, "timed out after 200ms (--timeout; 0 for none)"},
		{interrupt, "0", 130, "interrupted (SIGINT)"},
	} {
		pr, pw := io.Pipe()
		var out, errb bytes.Buffer
		c := &cli{stdin: pr, stdout: &out, stderr: &errb, allowMem: true}
		done := make(chan int, 1)
		go func() { done <- c.run(tc.ctx, []string{"publish", topic, "--key", "k", "--timeout", tc.timeout}) }()
		var code int
		select {
		case code = <-done:
		case <-time.After(time.Minute):
			pw.Close() // ends the read, so that the command returns
			<-done
			t.Fatalf("--timeout %s: publish still reading standard input a minute later", tc.timeout)
		}
		pw.Close()
		if code != tc.code || out.Len() != 0 || !strings.Contains(errb.String(), "keyorder: read payload from standard input: "+tc.msg) {
			t.Errorf("--timeout %s: exit %d, stdout %q, stderr %q; want exit %d and %q", tc.timeout, code, out.String(), errb.String(), tc.code, tc.msg)
		}
	}
}

// Secrets in the URL never reach the output, errors included.
func TestRedaction(t *testing.T) {
	for _, raw := range []string{
		"mem://t?subscription=s&token=t0psecret",
		"postgres://ops:t0psecret@127.0.0.1:1/db?topic=t&subscription=s&connect_timeout=1",
		"postgres://ops@127.0.0.1:1/db?topic=t&subscription=s&sslpassword=t0psecret&connect_timeout=1",
		"::not a url t0psecret",
		"mem://t?subscription=s&pasword=t0psecret",
		"mem://t?pasword=t0psecret&subscription=s&max_batch=x",
		"postgres://ops@127.0.0.1:1/db?topic=t&subscription=s&secret_key=t0psecret",
		"postgres://ops@127.0.0.1:1/db?topic=t&access_token=t0psecret&subscription=s&max_batch=x",
		"pubsub://p/t?subscription=s&apikey=t0psecret",
		"sqs://q.fifo?sessiontoken=t0psecret&lease=x",
		"pulsar://h:1/a/b/t?subscription=s&private_key=t0psecret&lease=x",
		"kafka://ops:t0psecret@127.0.0.1:1/t?group=g",
		"kafka://127.0.0.1:1/t?group=g&sasl_password=t0psecret",
		"kafka://127.0.0.1:1/t?group=g&sasl.jaas.config=t0psecret&lease=x",
		"host=127.0.0.1 port=1 user=ops password=t0psecret dbname=db",
	} {
		code, stdout, stderr := cmd(t, "", "stats", raw)
		if code == exitOK {
			t.Errorf("stats %s succeeded", raw)
		}
		if strings.Contains(stdout+stderr, "t0psecret") {
			t.Errorf("the secret was printed:\n%s%s", stdout, stderr)
		}
		if !strings.Contains(stderr, "keyorder: ") {
			t.Errorf("no error printed for %s: %q", raw, stderr)
		}
	}
	c := &cli{}
	c.addSecrets("postgres://ops:pw%2Fx@h/db?password=p2&topic=t")
	if got := c.clean("postgres://ops:pw%2Fx@h/db?password=p2&topic=t pw/x"); got != "postgres://ops:xxxxx@h/db?password=xxxxx&topic=t xxxxx" {
		t.Errorf("clean: %s", got)
	}
}

// exercise runs every command against one backend: publish, a handler
// that dead-letters a poison message, dead list/show/redrive (declined,
// then confirmed), tail of the redriven message, stats.
func exercise(t *testing.T, topicURL, subURL string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The subscription exists before anything is published.
	if code, stdout, stderr := cmd(t, "", "stats", subURL); code != exitOK || !strings.Contains(stdout, "dead letters") {
		t.Fatalf("stats: exit %d\n%s%s", code, stdout, stderr)
	}
	var ids []string
	for _, p := range []string{"m1", "poison", "m3"} {
		code, stdout, stderr := cmd(t, p, "publish", topicURL, "--key", "acct-42", "--header", "origin=cli", "--json")
		if code != exitOK {
			t.Fatalf("publish %s: exit %d\n%s%s", p, code, stdout, stderr)
		}
		var res struct {
			ID  string `json:"id"`
			Key string `json:"key"`
		}
		if err := json.Unmarshal([]byte(stdout), &res); err != nil || res.Key != "acct-42" || res.ID == "" {
			t.Fatalf("publish --json printed %q (%v)", stdout, err)
		}
		ids = append(ids, res.ID)
	}
	// A consumer acknowledges m1 and m3 and dead-letters poison.
	sub, err := subscribe.Open(ctx, subURL, &subscribe.Config{Workers: 2, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	handled := make(chan string, 10)
	done := make(chan error, 1)
	go func() {
		done <- sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
			handled <- string(d.Payload)
			if string(d.Payload) == "poison" {
				return keyorder.Permanent(errors.New("cannot apply"))
			}
			return nil
		})
	}()
	for range 3 {
		select {
		case <-handled:
		case <-ctx.Done():
			t.Fatal("messages not handled")
		}
	}
	var dead []deadJSON
	for deadline := time.Now().Add(30 * time.Second); ; {
		code, stdout, stderr := cmd(t, "", "dead", "list", subURL, "--json")
		if code != exitOK {
			t.Fatalf("dead list: exit %d\n%s%s", code, stdout, stderr)
		}
		if err := json.Unmarshal([]byte(stdout), &dead); err != nil {
			t.Fatalf("dead list --json: %v\n%s", err, stdout)
		}
		if len(dead) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	sub.Close(ctx)
	<-done
	if len(dead) != 1 || dead[0].ID != ids[1] || dead[0].Payload != "poison" || dead[0].Key != "acct-42" ||
		!strings.Contains(dead[0].Reason, "cannot apply") || dead[0].Attempts != 1 {
		t.Fatalf("dead letters %+v, want the poison message %s", dead, ids[1])
	}
	if st := statsOf(t, subURL); !is(st.Dead, 1) {
		t.Errorf("stats --json with one dead letter: dead %v", show(st.Dead))
	}
	code, stdout, stderr := cmd(t, "", "dead", "list", subURL)
	if code != exitOK || !strings.Contains(stdout, "ID") || !strings.Contains(stdout, ids[1]) || !strings.Contains(stderr, "1 dead letters") {
		t.Errorf("dead list (table): exit %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, _ = cmd(t, "", "dead", "show", subURL, "--id", ids[1])
	for _, w := range []string{"id:        " + ids[1], "key:       acct-42", "attempts:  1", "cannot apply", "header:    origin=cli", "payload:   poison"} {
		if code != exitOK || !strings.Contains(stdout, w) {
			t.Errorf("dead show: exit %d, lacks %q:\n%s", code, w, stdout)
		}
	}
	if code, _, stderr := cmd(t, "", "dead", "show", subURL, "--id", "no-such-id"); code != exitNotFound {
		t.Errorf("dead show of an unknown ID: exit %d (%s), want %d", code, stderr, exitNotFound)
	}
	if code, _, stderr := cmd(t, "n\n", "dead", "redrive", subURL, "--all"); code != exitDeclined || !strings.Contains(stderr, "redrive all 1 dead letters") {
		t.Errorf("declined redrive: exit %d, stderr %q", code, stderr)
	}
	if code, stdout, stderr := cmd(t, "y\n", "dead", "redrive", subURL, "--all"); code != exitOK || !strings.Contains(stdout, "redriven 1 of 1") {
		t.Fatalf("redrive --all: exit %d\n%s%s", code, stdout, stderr)
	}
	// Every backend's Redrive says which IDs are not dead letters.
	if code, stdout, stderr := cmd(t, "", "dead", "redrive", subURL, "--id", ids[1], "--id", "no-such-id"); code != exitNotFound ||
		!strings.Contains(stderr, fmt.Sprintf("2 IDs are not dead letters of the subscription: %q, \"no-such-id\"", ids[1])) {
		t.Errorf("second redrive of %s: exit %d, want %d (no longer dead) naming both IDs\n%s%s", ids[1], code, exitNotFound, stdout, stderr)
	}
	// The redriven message is delivered again: tail prints and acknowledges it.
	code, stdout, stderr = cmd(t, "", "tail", subURL, "--count", "1", "--for", "60s", "--json")
	var got tailJSON
	if code != exitOK || json.Unmarshal([]byte(strings.TrimSpace(stdout)), &got) != nil || got.ID != ids[1] || got.Payload != "poison" {
		t.Fatalf("tail: exit %d\n%s%s", code, stdout, stderr)
	}
	if st := statsOf(t, subURL); !is(st.Dead, 0) || st.Ordering != "ordered" {
		t.Errorf("stats --json: dead %v, ordering %q", show(st.Dead), st.Ordering)
	}
}

// statsFields are the keys of stats --json, on every backend.
var statsFields = []string{"url", "backend", "ordering", "native_hold", "lease_duration", "max_batch",
	"max_attempts", "min_backoff", "max_backoff", "pending", "dead", "keys", "held", "superseded", "unknown"}

// nullable are the fields a backend may leave null, in the order unknown
// lists them.
var nullable = []string{"max_attempts", "min_backoff", "max_backoff", "pending", "dead", "keys", "held", "superseded"}

// statsOf runs stats --json and checks its shape: every field present,
// the null ones exactly those unknown names, the others of their type.
func statsOf(t *testing.T, subURL string) statsJSON {
	t.Helper()
	code, stdout, stderr := cmd(t, "", "stats", subURL, "--json")
	if code != exitOK {
		t.Fatalf("stats --json: exit %d\n%s%s", code, stdout, stderr)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(stdout), &raw); err != nil {
		t.Fatalf("stats --json: %v\n%s", err, stdout)
	}
	var keys []string
	for k := range raw {
		keys = append(keys, k)
	}
	if slices.Sort(keys); !slices.Equal(keys, slices.Sorted(slices.Values(statsFields))) {
		t.Errorf("stats --json fields %q, want %q", keys, statsFields)
	}
	unknown, ok := raw["unknown"].([]any)
	if !ok {
		t.Errorf("stats --json: unknown is %#v, want a list", raw["unknown"])
	}
	var nulls []any
	for _, k := range nullable {
		if raw[k] == nil {
			nulls = append(nulls, k)
		}
	}
	if !slices.Equal(nulls, unknown) {
		t.Errorf("stats --json: null fields %q, unknown %q\n%s", nulls, unknown, stdout)
	}
	for _, k := range []string{"url", "backend", "ordering", "lease_duration"} {
		if s, ok := raw[k].(string); !ok || s == "" {
			t.Errorf("stats --json: %s is %#v", k, raw[k])
		}
	}
	if n, ok := raw["max_batch"].(float64); !ok || n < 1 {
		t.Errorf("stats --json: max_batch is %#v", raw["max_batch"])
	}
	var st statsJSON
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// is reports whether a count of stats --json is known and n.
func is(p *int64, n int64) bool { return p != nil && *p == n }

// show prints a count of stats --json.
func show(p *int64) string {
	if p == nil {
		return "null"
	}
	return fmt.Sprint(*p)
}

// The in-memory backend (in process) reports dead letters by listing them
// and nothing else: the rest is null and named in unknown.
func TestStatsJSONMemory(t *testing.T) {
	n := time.Now().UnixNano()
	st := statsOf(t, fmt.Sprintf("mem://cli-stats-%d?subscription=s-%d", n, n))
	if !is(st.Dead, 0) || st.Held != nil || st.Pending != nil || st.Superseded != nil || st.MaxAttempts != nil || st.Backend != "mem" ||
		!slices.Equal(st.Unknown, []string{"max_attempts", "min_backoff", "max_backoff", "pending", "keys", "held", "superseded"}) {
		t.Errorf("stats --json on memory: %+v", st)
	}
}

func TestMemory(t *testing.T) {
	// mem:// URLs share one broker per process: fresh names per run.
	n := time.Now().UnixNano()
	exercise(t, fmt.Sprintf("mem://cli-ledger-%d", n), fmt.Sprintf("mem://cli-ledger-%d?subscription=ops-%d&ordering=ordered", n, n))
}

func TestPostgres(t *testing.T) {
	base := testenv.Require(t, testenv.Postgres)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("topic", fmt.Sprintf("cli-%d", time.Now().UnixNano()))
	q.Set("migrate", "true")
	q.Set("create", "true")
	q.Set("schema", "keyorder_cli")
	u.RawQuery = q.Encode()
	topicURL := u.String()
	q.Set("subscription", "ops")
	q.Set("ordering", "ordered")
	u.RawQuery = q.Encode()
	exercise(t, topicURL, u.String())
	heldKey(t, topicURL, u.String())
}

// heldKey makes a handler ask for a retry in an hour and checks that held
// and stats show the key held.
func heldKey(t *testing.T, topicURL, subURL string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if code, _, stderr := cmd(t, "later", "publish", topicURL, "--key", "acct-9"); code != exitOK {
		t.Fatal(stderr)
	}
	sub, err := subscribe.Open(ctx, subURL, &subscribe.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	handled := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
			select {
			case handled <- struct{}{}:
			default:
			}
			return keyorder.RetryAfter(errors.New("not yet"), time.Hour)
		})
	}()
	select {
	case <-handled:
	case <-ctx.Done():
		t.Fatal("not handled")
	}
	sub.Close(ctx)
	<-done
	code, stdout, stderr := cmd(t, "", "held", subURL, "--json")
	var keys []heldJSON
	if code != exitOK || json.Unmarshal([]byte(stdout), &keys) != nil || len(keys) != 1 || keys[0].Key != "acct-9" ||
		keys[0].InFlight || time.Until(keys[0].Until) < 50*time.Minute {
		t.Errorf("held --json: exit %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr = cmd(t, "", "held", subURL)
	if code != exitOK || !strings.Contains(stdout, "acct-9") || !strings.Contains(stdout, "waiting (retry or publish delay)") {
		t.Errorf("held: exit %d\n%s%s", code, stdout, stderr)
	}
	if st := statsOf(t, subURL); !is(st.Held, 1) || len(st.Unknown) != 0 {
		t.Errorf("stats --json with a held key: held %s, unknown %q", show(st.Held), st.Unknown)
	}
}

// Backends that cannot list held keys say so, with exit code 3.
func TestHeldUnsupported(t *testing.T) {
	n := time.Now().UnixNano()
	code, _, stderr := cmd(t, "", "held", fmt.Sprintf("mem://cli-held-%d?subscription=held-%d", n, n))
	if code != exitUnsupported || !strings.Contains(stderr, "only PostgreSQL can list them") {
		t.Errorf("held on memory: exit %d, %s", code, stderr)
	}
}

func TestPubSubEmulator(t *testing.T) {
	testenv.Require(t, testenv.PubSub)
	topic := fmt.Sprintf("cli-%d", time.Now().UnixNano())
	exercise(t, "pubsub://cli-project/"+topic, "pubsub://cli-project/"+topic+"?subscription=ops&ordering=ordered")
}

func TestSQS(t *testing.T) {
	endpoint := testenv.Require(t, testenv.SQS)
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"} {
		if os.Getenv(k) == "" {
			t.Setenv(k, v)
		}
	}
	queue := fmt.Sprintf("cli-%d.fifo", time.Now().UnixNano())
	q := url.Values{"endpoint": {endpoint}, "region": {"us-east-1"}, "ordering": {"ordered"}}
	exercise(t, "sqs://"+queue+"?"+q.Encode(), "sqs://"+queue+"?"+q.Encode())
}

// A large redrive goes in batches and draws its progress on stderr.
func TestRedriveProgress(t *testing.T) {
	ctx := context.Background()
	const n = 250
	u := time.Now().UnixNano()
	topicURL, subURL := fmt.Sprintf("mem://cli-bulk-%d", u), fmt.Sprintf("mem://cli-bulk-%d?subscription=bulk-%d&ordering=exclusive", u, u)
	if code, _, stderr := cmd(t, "", "stats", subURL); code != exitOK {
		t.Fatal(stderr)
	}
	for i := range n {
		if code, _, stderr := cmd(t, "x", "publish", topicURL, "--key", fmt.Sprintf("k%d", i%7)); code != exitOK {
			t.Fatal(stderr)
		}
	}
	sub, err := subscribe.Open(ctx, subURL, &subscribe.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- sub.Run(runCtx, func(ctx context.Context, d *keyorder.Delivery) error {
			return keyorder.Permanent(errors.New("no"))
		})
	}()
	for deadline := time.Now().Add(time.Minute); int(counts(sub).DeadLettered) < n; {
		if time.Now().After(deadline) {
			t.Fatalf("dead-lettered %d of %d", counts(sub).DeadLettered, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	<-done
	code, stdout, stderr := cmd(t, "", "dead", "redrive", subURL, "--all", "--yes")
	if code != exitOK || !strings.Contains(stdout, fmt.Sprintf("redriven %d of %d", n, n)) ||
		!strings.Contains(stderr, "100/250 sent") || !strings.Contains(stderr, "[##############################] 250/250 sent, 250 redriven") {
		t.Errorf("redrive --all --yes: exit %d\n%s%s", code, stdout, stderr)
	}
}

func TestPulsar(t *testing.T) {
	base := testenv.Require(t, testenv.Pulsar)
	topic := fmt.Sprintf("%s/public/default/cli-%d", base, time.Now().UnixNano())
	exercise(t, topic, topic+"?subscription=ops&ordering=ordered")
}

// Kafka: the subscription URL creates the topic (stats runs first), the
// group is the subscription; dead letters live in TOPIC.GROUP.dead.
func TestKafka(t *testing.T) {
	brokers := testenv.Require(t, testenv.Kafka)
	topic := fmt.Sprintf("kafka://%s/cli-%d", brokers, time.Now().UnixNano())
	sub := topic + "?group=ops&ordering=ordered&create=true&partitions=2"
	exercise(t, topic, sub)
	// Kafka counts dead letters (by listing the dead-letter topic) and
	// nothing else; the subscriber holds keys in process.
	st := statsOf(t, sub)
	if st.Backend != "kafka" || st.NativeHold || st.LeaseDuration != "30s" || st.MaxBatch != 500 || !is(st.Dead, 0) ||
		!slices.Equal(st.Unknown, []string{"max_attempts", "min_backoff", "max_backoff", "pending", "keys", "held", "superseded"}) {
		t.Errorf("stats --json on Kafka: %+v", st)
	}
	// Held keys stay in the consuming process: not listable.
	if code, _, stderr := cmd(t, "", "held", sub); code != exitUnsupported || !strings.Contains(stderr, "hold keys inside the consuming process") || !strings.Contains(stderr, "Kafka") {
		t.Errorf("held on Kafka: exit %d, %s", code, stderr)
	}
	// A topic that does not exist (no create=true) is not found, and the
	// error says how to create it.
	missing := fmt.Sprintf("kafka://%s/cli-missing-%d", brokers, time.Now().UnixNano())
	if code, stdout, stderr := cmd(t, "", "stats", missing+"?group=ops"); code != exitNotFound || stdout != "" || !strings.Contains(stderr, "create=true") {
		t.Errorf("stats of a missing topic: exit %d, stdout %q, stderr %q; want exit %d", code, stdout, stderr, exitNotFound)
	}
	if code, _, stderr := cmd(t, "x", "publish", missing, "--key", "k"); code != exitNotFound || !strings.Contains(stderr, "create=true") {
		t.Errorf("publish to a missing topic: exit %d, stderr %q; want exit %d", code, stderr, exitNotFound)
	}
	// A subscription parameter on the topic URL of publish is a usage error.
	if code, _, stderr := cmd(t, "x", "publish", sub, "--key", "k"); code != exitUsage || !strings.Contains(stderr, `parameter "group"`) {
		t.Errorf("publish to a subscription URL: exit %d, stderr %q; want exit %d", code, stderr, exitUsage)
	}
}

// NATS: the URLs create the stream (stats runs first); dead letters live
// in the stream STREAM_dead and are listed, shown and redriven as on every
// backend.
func TestNATS(t *testing.T) {
	server := testenv.Require(t, testenv.NATS)
	topic := fmt.Sprintf("%s/CLI_%d", server, time.Now().UnixNano())
	sub := topic + "?subscription=ops&ordering=ordered&lease=5s&create=true&partitions=2"
	exercise(t, topic, sub)
	st := statsOf(t, sub)
	if st.Backend != "nats" || st.NativeHold || st.LeaseDuration != "5s" || st.MaxBatch != 500 || !is(st.Dead, 0) ||
		!slices.Equal(st.Unknown, []string{"max_attempts", "min_backoff", "max_backoff", "pending", "keys", "held", "superseded"}) {
		t.Errorf("stats --json on NATS: %+v", st)
	}
	if code, _, stderr := cmd(t, "", "held", sub); code != exitUnsupported || !strings.Contains(stderr, "NATS") {
		t.Errorf("held on NATS: exit %d, %s", code, stderr)
	}
	// A stream that does not exist (no create=true) is not found.
	missing := fmt.Sprintf("%s/CLI_missing_%d", server, time.Now().UnixNano())
	if code, _, stderr := cmd(t, "x", "publish", missing, "--key", "k"); code != exitNotFound {
		t.Errorf("publish to a missing stream: exit %d, stderr %q; want exit %d", code, stderr, exitNotFound)
	}
	// msg_id is a topic parameter: on a subscription URL it is a usage error.
	if code, _, stderr := cmd(t, "", "stats", sub+"&msg_id=off"); code != exitUsage || !strings.Contains(stderr, `parameter "msg_id"`) {
		t.Errorf("stats with msg_id: exit %d, stderr %q; want exit %d", code, stderr, exitUsage)
	}
	if code, _, stderr := cmd(t, "x", "publish", topic+"?msg_id=off", "--key", "k"); code != exitOK {
		t.Errorf("publish with msg_id=off: exit %d, stderr %q", code, stderr)
	}
}

// counts returns the subscriber's counts.
func counts(s *subscribe.Subscriber) subscribe.Stats {
	st, _ := s.Stats(context.Background())
	return st
}

// The confirmation prompt of redrive --all counts towards --timeout: an
// operator who never answers does not keep the command running.
func TestRedrivePromptTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := time.Now().UnixNano()
	topicURL, subURL := fmt.Sprintf("mem://cli-prompt-%d", n), fmt.Sprintf("mem://cli-prompt-%d?subscription=p-%d", n, n)
	if code, _, stderr := cmd(t, "", "stats", subURL); code != exitOK {
		t.Fatal(stderr)
	}
	if code, _, stderr := cmd(t, "x", "publish", topicURL, "--key", "k"); code != exitOK {
		t.Fatal(stderr)
	}
	sub, err := subscribe.Open(ctx, subURL, &subscribe.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- sub.Run(runCtx, func(ctx context.Context, d *keyorder.Delivery) error {
			return keyorder.Permanent(errors.New("no"))
		})
	}()
	for counts(sub).DeadLettered < 1 {
		select {
		case <-ctx.Done():
			t.Fatal("not dead-lettered")
		case <-time.After(10 * time.Millisecond):
		}
	}
	stop()
	<-done
	// stdin that never answers.
	pr, pw := io.Pipe()
	defer pw.Close()
	var out, errb bytes.Buffer
	c := &cli{stdin: pr, stdout: &out, stderr: &errb, allowMem: true}
	code := c.run(ctx, []string{"dead", "redrive", subURL, "--all", "--timeout", "300ms"})
	if code != exitFailure || !strings.Contains(errb.String(), "redrive all 1 dead letters") ||
		!strings.Contains(errb.String(), "keyorder: confirmation: timed out after 300ms") {
		t.Errorf("unanswered prompt: exit %d\n%s%s", code, out.String(), errb.String())
	}
	if dls, err := sub.DeadLetters(ctx, 0); err != nil || len(dls) != 1 {
		t.Errorf("after the timed-out prompt: %d dead letters (%v), want 1", len(dls), err)
	}
}
