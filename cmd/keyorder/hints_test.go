package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"testing"
)

// A mistyped command, subcommand, flag, URL scheme or URL parameter gets
// exit 2 and a "did you mean" naming the right one; flags are spelled as
// the help spells them (--timeout, never -timeout); the operator is never
// asked about a forgotten import.
func TestDidYouMean(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"stat", "x"}, `unknown command "stat" (did you mean "stats"?)`},
		{[]string{"pubish", "x"}, `unknown command "pubish" (did you mean "publish"?)`},
		{[]string{"dead", "lst", "x"}, `dead: unknown subcommand "lst" (did you mean "list"?)`},
		{[]string{"dead", "redirve", "x"}, `dead: unknown subcommand "redirve" (did you mean "redrive"?)`},
		{[]string{"--timout", "1s", "stats"}, "unknown flag --timout (did you mean --timeout?)"},
		{[]string{"--json", "stats", "x"}, "unknown flag --json before the command: it is a flag of the commands"},
		{[]string{"stats", "--jsn", "x"}, "stats: unknown flag --jsn (did you mean --json?)"},
		{[]string{"dead", "redrive", "x", "--al"}, "dead redrive: unknown flag --al (did you mean --all?)"},
		{[]string{"dead", "list", "x", "--limit"}, "dead list: flag --limit needs a value"},
		{[]string{"stats", "x", "--timeout=soon"}, `stats: invalid value "soon" for flag --timeout: parse error`},
		{[]string{"stats", "x", "--json=maybe"}, `stats: invalid boolean value "maybe" for --json`},
		{[]string{"stats", "kafak://h:9092/t?group=g"}, `stats: unknown URL scheme "kafak" (did you mean kafka://?): keyorder opens `},
		{[]string{"stats", "rabbit://h/q"}, `stats: unknown URL scheme "rabbit": keyorder opens `},
		// Every backend's URL parsing, through the library's typed error.
		{[]string{"stats", "postgres://ops@127.0.0.1:1/db?topic=t&subscripton=s"}, `parameter "subscripton": unknown parameter (did you mean "subscription"?)`},
		{[]string{"stats", "pubsub://p/t?subscripton=s"}, `parameter "subscripton": unknown parameter (did you mean "subscription"?)`},
		{[]string{"stats", "sqs://q.fifo?endpiont=http://127.0.0.1:1"}, `parameter "endpiont": unknown parameter (did you mean "endpoint"?)`},
		{[]string{"stats", "pulsar://127.0.0.1:1/a/b/t?subscripton=s"}, `parameter "subscripton": unknown parameter (did you mean "subscription"?)`},
		{[]string{"stats", "kafka://127.0.0.1:1/t?grup=g"}, `parameter "grup": unknown parameter (did you mean "group"?)`},
		{[]string{"stats", "nats://127.0.0.1:1/S?subscripton=s"}, `parameter "subscripton": unknown parameter (did you mean "subscription"?)`},
		{[]string{"stats", "mem://t?subscription=s&max_bacth=2"}, `parameter "max_bacth": unknown parameter (did you mean "max_batch"?)`},
	} {
		code, stdout, stderr := cmd(t, "", tc.args...)
		if code != exitUsage || stdout != "" || !strings.Contains(stderr, tc.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, stdout, stderr, tc.want)
		}
		for _, bad := range []string{"forgotten import", "flag provided but not defined", " -timeout", " -json", " -limit", " -all"} {
			if strings.Contains(stderr, bad) {
				t.Errorf("%q: stderr says %q: %s", tc.args, bad, stderr)
			}
		}
	}
}

// A short value of an undeclared parameter (hidden: it may be a
// misspelt password) is hidden where it stands alone, not inside every
// word of the message: "grup=g" keeps "group" readable, and a value "x"
// does not multiply the x's of the redaction.
func TestShortSecretsStayReadable(t *testing.T) {
	code, _, stderr := cmd(t, "", "stats", "kafka://127.0.0.1:1/t?grup=g")
	if code != exitUsage || !strings.Contains(stderr, `"kafka://127.0.0.1:1/t?grup=xxxxx"`) || !strings.Contains(stderr, `(did you mean "group"?)`) {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
	c := &cli{}
	c.addSecrets("kafka://h:1/t?grup=x&pw=ab&pw2=ab")
	if got, want := c.clean("grup=x, xxxxx, box, ab-ab, abc, pw=ab&pw2=ab"), "grup=xxxxx, xxxxx, box, xxxxx-xxxxx, abc, pw=xxxxx&pw2=xxxxx"; got != want {
		t.Errorf("clean: %q, want %q", got, want)
	}
}

// keyorder --version is keyorder version, --json included.
func TestVersionFlag(t *testing.T) {
	_, want, _ := cmd(t, "", "version")
	for _, args := range [][]string{{"--version"}, {"-version"}, {"--timeout", "1s", "--version"}} {
		code, stdout, stderr := cmd(t, "", args...)
		if code != exitOK || stderr != "" || stdout != want {
			t.Errorf("%q: exit %d, stderr %q, stdout %q; want %q", args, code, stderr, stdout, want)
		}
	}
	code, stdout, _ := cmd(t, "", "--version", "--json")
	var v versionJSON
	if code != exitOK || json.Unmarshal([]byte(stdout), &v) != nil || v.Version == "" || v.Go != runtime.Version() {
		t.Errorf("--version --json: exit %d\n%s", code, stdout)
	}
	if _, help, _ := cmd(t, "", "--help"); !strings.Contains(help, "\n  --version ") {
		t.Errorf("--help does not offer --version:\n%s", help)
	}
}

// closedPort returns a 127.0.0.1 address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// A broker that does not answer is named as such, on every backend's
// path: the backend, its address, and the --timeout when it passed
// (Kafka, NATS, Pulsar and Pub/Sub clients retry until it does) or the
// dial's failure (PostgreSQL and SQS give up first); never only "context
// deadline exceeded". A listener that accepts and never answers keeps the
// plain timeout message (TestTimeout).
func TestBrokerDoesNotAnswer(t *testing.T) {
	addr := closedPort(t)
	t.Setenv("PUBSUB_EMULATOR_HOST", addr)
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	for _, tc := range []struct {
		url, want string
	}{
		{"postgres://ops@" + addr + "/db?topic=t&subscription=s", "no PostgreSQL server answered at " + addr + " "},
		{"kafka://" + addr + "/t?group=g", "no Kafka broker answered at " + addr + " within 1s (connection refused): "},
		{"nats://" + addr + "/S?subscription=s", "no NATS server answered at " + addr + " within 1s (connection refused): "},
		{"pulsar://" + addr + "/a/b/t?subscription=s", "no Pulsar broker answered at " + addr + " within 1s (connection refused): "},
		{"sqs://q.fifo?region=us-east-1&endpoint=http://" + addr, "no SQS endpoint answered at " + addr + " "},
		{"pubsub://p/t?subscription=s", "no Pub/Sub emulator answered at " + addr + " within 1s (connection refused): "},
	} {
		cmds := [][]string{{"stats", tc.url, "--timeout", "1s"}}
		if strings.HasPrefix(tc.url, "kafka:") || strings.HasPrefix(tc.url, "postgres:") {
			// Another command's path, on a backend that times out and one
			// that fails at once.
			cmds = append(cmds, []string{"dead", "list", tc.url, "--timeout", "1s"})
		}
		for _, args := range cmds {
			code, stdout, stderr := cmd(t, "", args...)
			if code != exitFailure || stdout != "" || !strings.Contains(stderr, tc.want) || !strings.Contains(stderr, "(connection refused)") {
				t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 1 and %q", args, code, stdout, stderr, tc.want)
			}
		}
	}
	// Two Kafka brokers, neither answering: both named.
	other := closedPort(t)
	code, _, stderr := cmd(t, "", "stats", "kafka://"+addr+","+other+"/t?group=g", "--timeout", "1s")
	if want := "no Kafka broker answered at " + addr + ", " + other + " within 1s"; code != exitFailure || !strings.Contains(stderr, want) {
		t.Errorf("two brokers: exit %d, stderr %q; want %q", code, stderr, want)
	}
}

// The probe names the default port of each scheme when the URL gives
// none, and reads the SQS endpoint and the Pub/Sub emulator's address.
func TestEndpointOf(t *testing.T) {
	t.Setenv("PUBSUB_EMULATOR_HOST", "")
	for raw, want := range map[string]string{
		"postgres://db.example/app?topic=t":         "PostgreSQL server [db.example:5432]",
		"postgresql://a,b:5433/app?topic=t":         "PostgreSQL server [a:5432 b:5433]",
		"kafka://k1,k2:9093/t?group=g":              "Kafka broker [k1:9092 k2:9093]",
		"nats://n/S":                                "NATS server [n:4222]",
		"pulsar://p/a/b/t":                          "Pulsar broker [p:6650]",
		"pulsar+ssl://p/a/b/t":                      "Pulsar broker [p:6651]",
		"sqs://q.fifo?endpoint=https://sqs.example": "SQS endpoint [sqs.example:443]",
		"sqs://q.fifo?endpoint=http://[::1]:9324":   "SQS endpoint [[::1]:9324]",
		"pubsub://p/t?subscription=s":               "Pub/Sub endpoint [pubsub.googleapis.com:443]",
	} {
		e, ok := endpointOf(raw)
		if got := fmt.Sprint(e.what, " ", e.addrs); !ok || got != want {
			t.Errorf("endpointOf(%q) = %q, %v; want %q", raw, got, ok, want)
		}
	}
	for _, raw := range []string{"sqs://q.fifo", "mem://t", "::bad"} {
		if e, ok := endpointOf(raw); ok {
			t.Errorf("endpointOf(%q) = %v, want none", raw, e)
		}
	}
}

// onceHandler passes each level and message once, whatever the attributes,
// through derived handlers too.
func TestOnceHandler(t *testing.T) {
	var b strings.Builder
	l := slog.New(newOnceHandler(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelWarn})))
	for i := range 5 {
		l.Warn("Failed to connect to broker.", "attempt", i)
		l.With("remote_addr", "x").Warn("Failed to connect to broker.")
	}
	l.Error("Failed to connect to broker.")
	l.Warn("another")
	l.Info("below the level")
	if got := strings.Count(b.String(), "\n"); got != 3 || !strings.Contains(b.String(), "attempt=0") {
		t.Errorf("%d lines:\n%s", got, b.String())
	}
}
