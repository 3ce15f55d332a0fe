package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runMainEnv makes the test binary run main instead of the tests, so that
// TestQuickStartOutput runs the program as a process of its own, exactly as
// `go run ./examples/quickstart` does, without compiling it again.
const runMainEnv = "KEYORDER_QUICKSTART_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestREADMEQuickStartIsThisProgram checks that the README's quick start
// block is this program byte for byte, so that what a reader pastes is what
// TestQuickStartOutput runs.
func TestREADMEQuickStartIsThisProgram(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	block, err := quickStartBlock(string(readme))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	if block == string(src) {
		return
	}
	bl, sl := strings.Split(block, "\n"), strings.Split(string(src), "\n")
	for i := 0; i < max(len(bl), len(sl)); i++ {
		var b, s string
		if i < len(bl) {
			b = bl[i]
		}
		if i < len(sl) {
			s = sl[i]
		}
		if b != s {
			t.Fatalf("README quick start differs from examples/quickstart/main.go at line %d:\nREADME:  %q\nmain.go: %q\ncopy main.go into the README's block (or the other way round)", i+1, b, s)
		}
	}
	t.Fatalf("README quick start differs from examples/quickstart/main.go (%d vs %d bytes)", len(block), len(src))
}

// quickStartBlock returns the body of the first ```go block after the
// "## Quick start" heading.
func quickStartBlock(readme string) (string, error) {
	_, section, ok := strings.Cut(readme, "\n## Quick start\n")
	if !ok {
		return "", errors.New("README has no \"## Quick start\" heading")
	}
	if next := strings.Index(section, "\n## "); next >= 0 {
		section = section[:next]
	}
	_, body, ok := strings.Cut(section, "\n```go\n")
	if !ok {
		return "", errors.New("README's quick start has no ```go block")
	}
	body, _, ok = strings.Cut(body, "\n```\n")
	if !ok {
		return "", errors.New("README's quick start block is not closed")
	}
	return body + "\n", nil
}

// TestQuickStartOutput runs the program and checks what it prints: every
// adjustment applied, the failed one retried before the one behind it.
func TestQuickStartOutput(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// Bounded: the program normally ends in well under a second (one retry
	// after a 100 ms backoff); a generous bound for a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("quickstart: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	want := `acct-42 {"delta":-500} applied at attempt 1
acct-42 {"delta":200} attempt 1 failed
acct-42 {"delta":200} applied at attempt 2
acct-42 {"delta":50} applied at attempt 1
`
	if got := stdout.String(); got != want {
		t.Errorf("quickstart printed:\n%s\nwant:\n%s\nstderr:\n%s", got, want, stderr.String())
	}
}
