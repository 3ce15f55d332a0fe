package testenv

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStartStopPostgres starts a PostgreSQL server through the same code the
// launcher uses, checks its settings, stops it and checks that none of its
// processes is left. It needs the PostgreSQL server binaries (skipped without).
func TestStartStopPostgres(t *testing.T) {
	if _, err := postgresBinDir(); err != nil {
		t.Skip(err)
	}
	if _, err := postgresCredential(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var log strings.Builder
	e, err := Start(ctx, Options{Log: &log}, []string{Postgres}, false)
	if err != nil {
		t.Fatalf("Start: %v\n%s", err, log.String())
	}
	url := e.Settings.PostgresURL
	if !strings.HasPrefix(url, "postgres://postgres@127.0.0.1:") || !strings.HasSuffix(url, "/keyorder?sslmode=disable") {
		t.Errorf("PostgresURL = %q", url)
	}
	s := e.Servers[0]
	procs := tree(s.PID())
	if len(procs) < 2 {
		t.Errorf("expected the postmaster and its children, found %v", procs)
	}
	if s.RSS() <= 0 {
		t.Errorf("RSS = %d", s.RSS())
	}
	if err := e.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	for pid, start := range procs {
		if _, st, ok := procInfo(pid); ok && st == start {
			t.Errorf("process %d still runs after Stop", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if _, err := os.Stat(e.Dir); !os.IsNotExist(err) {
		t.Errorf("data dir %s not removed: %v", e.Dir, err)
	}
}

// TestStartStopKafka starts the Kafka broker through the same code the launcher
// uses, checks that a topic is auto-created with the configured 4 partitions,
// all with a leader, stops it and checks that none of its processes is left. It
// needs java and mvn (skipped without, except under CI=true).
func TestStartStopKafka(t *testing.T) {
	if _, err := javaCmd(); err != nil {
		skipOrFailInCI(t, err)
	}
	if _, err := exec.LookPath("mvn"); err != nil {
		skipOrFailInCI(t, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var log strings.Builder
	e, err := Start(ctx, Options{Log: &log}, []string{Kafka}, false)
	if err != nil {
		t.Fatalf("Start: %v\n%s", err, log.String())
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = e.Stop()
		}
	}()
	addr := e.Settings.KafkaBrokers
	if !regexp.MustCompile(`^127\.0\.0\.1:[0-9]+$`).MatchString(addr) {
		t.Errorf("KafkaBrokers = %q", addr)
	}
	if got := e.Settings.Environ(); len(got) != 1 || got[0] != EnvKafkaBrokers+"="+addr {
		t.Errorf("Environ = %q", got)
	}

	const topic = "keyorder-testenv-probe"
	md, err := requestMetadata(ctx, addr, []string{topic}, false)
	if err != nil {
		t.Fatalf("metadata: %v", err)
	}
	if len(md.Brokers) != 1 || md.Brokers[0] != addr {
		t.Errorf("brokers = %v, want [%s]", md.Brokers, addr)
	}
	const unknownTopic = 3 // UNKNOWN_TOPIC_OR_PARTITION
	if len(md.Topics) != 1 || md.Topics[0].Name != topic || md.Topics[0].ErrorCode != unknownTopic {
		t.Errorf("topics before auto-creation = %+v, want %s with error %d", md.Topics, topic, unknownTopic)
	}
	// Auto-creation answers LEADER_NOT_AVAILABLE until the partitions exist.
	deadline := time.Now().Add(30 * time.Second)
	var last kafkaTopicMetadata
	for {
		md, err := requestMetadata(ctx, addr, []string{topic}, true)
		if err != nil {
			t.Fatalf("metadata: %v", err)
		}
		if len(md.Topics) == 1 {
			last = md.Topics[0]
			if last.ErrorCode == 0 && last.Partitions == 4 && last.Leaders == 4 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("topic %s not auto-created with 4 led partitions within 30s: %+v", topic, last)
		}
		time.Sleep(100 * time.Millisecond)
	}

	s := e.Servers[0]
	procs := tree(s.PID())
	if s.RSS() <= 0 {
		t.Errorf("RSS = %d", s.RSS())
	}
	stopped = true
	if err := e.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	for pid, start := range procs {
		if _, st, ok := procInfo(pid); ok && st == start {
			t.Errorf("process %d still runs after Stop", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if _, err := os.Stat(e.Dir); !os.IsNotExist(err) {
		t.Errorf("data dir %s not removed: %v", e.Dir, err)
	}
	if _, err := metadataBrokers(ctx, addr); err == nil {
		t.Errorf("broker %s still answers after Stop", addr)
	}
}

// skipOrFailInCI skips the test for a missing prerequisite, or fails it under
// CI=true, where every server must be testable.
func skipOrFailInCI(t *testing.T, err error) {
	t.Helper()
	if os.Getenv(EnvCI) == "true" {
		t.Fatalf("%v (required under CI=true)", err)
	}
	t.Skip(err)
}
