package testenv

import (
	"context"
	"os"
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
