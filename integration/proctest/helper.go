package proctest

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Helper processes. Run's consumer fits a test of the guarantee through
// the portable subscriber. A test whose consumer is its own (one that
// drives the driver directly, or whose handler hangs on purpose) uses the
// same process plumbing through these:
//
//   - TestMain calls Helpers (after Main) with its helpers by name;
//   - the test starts one with Start(t, name, env...) and kills it with
//     Kill (SIGKILL, as a crash; also at the end of the test);
//   - the helper writes its records with Records, one line in one write,
//     so a kill leaves whole lines, and the test reads them with Lines.

// Helpers runs, in a process Start started as name, helpers[name] and exits
// with its status. In any other process it returns at once. Call it in
// TestMain before m.Run.
func Helpers(helpers map[string]func() int) {
	role, ok := strings.CutPrefix(os.Getenv(envRole), "helper:")
	if !ok {
		return
	}
	h := helpers[role]
	if h == nil {
		fmt.Fprintf(os.Stderr, "proctest: no helper %q\n", role)
		os.Exit(2)
	}
	os.Exit(h())
}

// Records returns, in a helper process, a function that appends one line
// to the process's records file (one write per line, safe for concurrent
// use).
func Records() (func(format string, args ...any), error) { return openRecords() }

// Proc is a helper process started by Start.
type Proc struct{ p *process }

var procs atomic.Int64

// Start starts the test binary as helper name (see Helpers) with env added
// to its environment. The helper is killed when the test ends.
func Start(t testing.TB, name string, env ...string) *Proc {
	t.Helper()
	p, err := startProcess(t.TempDir(), int(procs.Add(1)), "helper:"+name, env)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.kill)
	return &Proc{p: p}
}

// Kill SIGKILLs the helper and waits until it is gone; once it is, Kill
// does nothing.
func (p *Proc) Kill() { p.p.kill() }

// Lines returns the lines the helper has written so far, each split into
// its fields (a line a kill cut short may have fewer).
func (p *Proc) Lines(t testing.TB) [][]string {
	t.Helper()
	ls, err := readLines(p.p.records)
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

// WaitUntil polls cond every 20ms until it holds, and fails the test if d
// passes first.
func WaitUntil(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		<-tick.C
	}
}
