package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/integration/testenv"
	"github.com/keyorder/keyorder/subscribe"
)

// cmd runs the CLI in process.
func cmd(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code = run(ctx, args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		nil, {"nope"}, {"dead"}, {"dead", "purge", "mem://t?subscription=s"},
		{"dead", "list"}, {"dead", "list", "a", "b"},
		{"dead", "redrive", "mem://t?subscription=s"},
		{"dead", "redrive", "mem://t?subscription=s", "--all", "--id", "x"},
		{"dead", "show", "mem://t?subscription=s"},
		{"stats", "--bogus", "mem://t?subscription=s"},
	} {
		code, _, stderr := cmd(t, "", args...)
		if code != exitUsage || !strings.Contains(stderr, "usage:") {
			t.Errorf("%q: exit %d, stderr %q; want exit %d with the usage", args, code, stderr, exitUsage)
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
	code, stdout, stderr := cmd(t, "", "stats", subURL, "--json")
	var st statsJSON
	if code != exitOK || json.Unmarshal([]byte(stdout), &st) != nil || st.Dead != 1 {
		t.Errorf("stats --json with one dead letter: exit %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr = cmd(t, "", "dead", "list", subURL)
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
	if code, stdout, stderr := cmd(t, "", "dead", "redrive", subURL, "--id", ids[1]); code != exitNotFound {
		t.Errorf("second redrive of %s: exit %d, want %d (no longer dead)\n%s%s", ids[1], code, exitNotFound, stdout, stderr)
	}
	// The redriven message is delivered again: tail prints and acknowledges it.
	code, stdout, stderr = cmd(t, "", "tail", subURL, "--count", "1", "--for", "60s", "--json")
	var got tailJSON
	if code != exitOK || json.Unmarshal([]byte(strings.TrimSpace(stdout)), &got) != nil || got.ID != ids[1] || got.Payload != "poison" {
		t.Fatalf("tail: exit %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr = cmd(t, "", "stats", subURL, "--json")
	st = statsJSON{}
	if code != exitOK || json.Unmarshal([]byte(stdout), &st) != nil || st.Dead != 0 || st.Ordering != "ordered" {
		t.Errorf("stats --json: exit %d\n%s%s", code, stdout, stderr)
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
	code, stdout, stderr = cmd(t, "", "stats", subURL, "--json")
	var st statsJSON
	if code != exitOK || json.Unmarshal([]byte(stdout), &st) != nil || st.Held != 1 {
		t.Errorf("stats --json with a held key: exit %d\n%s%s", code, stdout, stderr)
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

// counts returns the subscriber's counts.
func counts(s *subscribe.Subscriber) subscribe.Stats {
	st, _ := s.Stats(context.Background())
	return st
}
