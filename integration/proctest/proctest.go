// Package proctest runs a backend's consumers as real processes, so that a
// crash test kills what a crash kills: a process holding leases, with
// handlers running, settlements in flight and start records not yet
// written. An in-process "crash" (closing a subscriber, cancelling a
// context) always lets something finish that a SIGKILL or an os.Exit does
// not, which is exactly where the attempt counting of issue 28 broke.
//
// The consumer is the test binary itself, re-executed: a backend's TestMain
// calls Main first, which in a helper process opens the subscriber with
// the backend's own Open function, runs it, and never returns. The parent
// test describes a Scenario (keys, messages, a poison message that makes
// its consumer exit, random SIGKILLs) and Run checks, from the records the
// handlers append to one file per process: every message completes, a key's
// messages complete in publish order, no two attempts of a key overlap,
// nothing is dead-lettered before MaxAttempts runs of its own (nor unrun),
// and the poison message is dead-lettered within MaxAttempts+1 runs.
package proctest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// Environment variables that make the test binary a consumer process.
const (
	envRole        = "KEYORDER_PROCTEST"         // "consumer" in a helper process
	envRecords     = "KEYORDER_PROCTEST_RECORDS" // the file the handlers append to
	envPoison      = "KEYORDER_PROCTEST_POISON"  // the ID whose handler exits the process
	envFail        = "KEYORDER_PROCTEST_FAIL"    // probability that an attempt fails
	envMaxAttempts = "KEYORDER_PROCTEST_MAX_ATTEMPTS"
	envWorkers     = "KEYORDER_PROCTEST_WORKERS"
)

// PoisonExitCode is the exit status of a consumer whose handler got the
// poison message.
const PoisonExitCode = 3

// Params is what a consumer process passes to the backend's Open.
type Params struct {
	// Config is the subscriber's configuration: the Scenario's MaxAttempts
	// with short backoffs, its Workers, a silent logger.
	Config *subscribe.Config
}

// OpenFunc opens the backend's subscriber in a consumer process. It reads
// its own connection settings from the environment (the variables the
// test put in Scenario.Env).
type OpenFunc func(ctx context.Context, p Params) (*subscribe.Subscriber, error)

// Main makes the test binary a consumer when it was started as one by Run:
// it opens the subscriber with open, consumes until it is killed (or its
// handler gets the poison message), and exits. In any other process it
// returns at once. Call it first in TestMain.
func Main(open OpenFunc) {
	if os.Getenv(envRole) != "consumer" {
		return
	}
	os.Exit(consume(open))
}

// consume is a consumer process's life. Each attempt appends
// "start id attempt unixnano", then "end id attempt unixnano ok|fail", to
// the records file in one write each, so that a kill leaves whole lines.
func consume(open OpenFunc) int {
	ctx := context.Background()
	write, err := openRecords()
	if err != nil {
		fmt.Fprintln(os.Stderr, "proctest:", err)
		return 2
	}
	maxAttempts, _ := strconv.Atoi(os.Getenv(envMaxAttempts))
	workers, _ := strconv.Atoi(os.Getenv(envWorkers))
	failP, _ := strconv.ParseFloat(os.Getenv(envFail), 64)
	poison := os.Getenv(envPoison)
	// The subscriber's and the driver's log, every level, goes to a file
	// beside the records: a failing check prints the lines about the
	// messages it traces (see logLines).
	var logw io.Writer = io.Discard
	if f, err := os.OpenFile(os.Getenv(envRecords)+".log", os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644); err == nil {
		logw = f
	}
	quiet := slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelDebug}))
	sub, err := open(ctx, Params{Config: &subscribe.Config{
		Workers: workers, Logger: quiet,
		Retry: policy.Retry{MaxAttempts: maxAttempts, MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond},
	}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "proctest: open:", err)
		return 2
	}
	err = sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
		write("start %s %d %d", d.ID, d.Attempt, time.Now().UnixNano())
		if poison != "" && d.ID == poison {
			os.Exit(PoisonExitCode) // a segfault, an OOM kill, os.Exit in a library
		}
		time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
		if rand.Float64() < failP {
			write("end %s %d %d fail", d.ID, d.Attempt, time.Now().UnixNano())
			return fmt.Errorf("proctest: injected failure of %s", d.ID)
		}
		write("end %s %d %d ok", d.ID, d.Attempt, time.Now().UnixNano())
		return nil
	})
	fmt.Fprintln(os.Stderr, "proctest: run:", err)
	return 2
}

// record is one line of a records file.
type record struct {
	start   bool
	id      string
	attempt int
	at      int64
	ok      bool
	proc    int // the process (its start index in the test)
}

// readRecords reads the records file of process proc.
func readRecords(path string, proc int) ([]record, error) {
	lines, err := readLines(path)
	var out []record
	for _, fs := range lines {
		if len(fs) < 4 || fs[0] == "end" && len(fs) < 5 {
			continue // a line cut by a kill
		}
		r := record{start: fs[0] == "start", id: fs[1], proc: proc}
		r.attempt, _ = strconv.Atoi(fs[2])
		r.at, _ = strconv.ParseInt(fs[3], 10, 64)
		r.ok = len(fs) > 4 && fs[4] == "ok"
		out = append(out, r)
	}
	return out, err
}

// readLines reads a records file, each line split into its fields; a
// missing file has no lines.
func readLines(path string) ([][]string, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out [][]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		out = append(out, strings.Fields(sc.Text()))
	}
	return out, sc.Err()
}

// openRecords opens the records file of this process for appending and
// returns a function that writes one line to it in one write (so that a
// kill leaves whole lines), safe for concurrent use.
func openRecords() (func(format string, args ...any), error) {
	rec, err := os.OpenFile(os.Getenv(envRecords), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	return func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		_, _ = rec.WriteString(fmt.Sprintf(format, args...) + "\n")
	}, nil
}

// process is one consumer process started by Run.
type process struct {
	index   int
	cmd     *exec.Cmd
	records string
	exited  chan struct{}
	endAt   int64 // when Wait returned (unixnano); valid after exited
	code    int
}

// startProcess re-executes the test binary as role ("consumer" for Run's
// consumer, "helper:NAME" for a helper Start starts) with env added; its
// records file is in dir.
func startProcess(dir string, index int, role string, env []string) (*process, error) {
	p := &process{index: index, records: fmt.Sprintf("%s/records-%03d", dir, index), exited: make(chan struct{})}
	p.cmd = exec.Command(os.Args[0], "-test.run=^$")
	p.cmd.Env = append(append(os.Environ(), env...), envRole+"="+role, envRecords+"="+p.records)
	p.cmd.Stderr = os.Stderr
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("proctest: start %s: %w", role, err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.endAt = time.Now().UnixNano()
		p.code = p.cmd.ProcessState.ExitCode()
		close(p.exited)
	}()
	return p, nil
}

// kill SIGKILLs p and waits until it is gone (again: nothing).
func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// msgID is the ID of message seq of key.
func msgID(key string, seq int) string { return fmt.Sprintf("%s-%03d", key, seq) }

// parseID splits an ID made by msgID.
func parseID(id string) (key string, seq int, ok bool) {
	i := strings.LastIndexByte(id, '-')
	if i < 0 {
		return "", 0, false
	}
	seq, err := strconv.Atoi(id[i+1:])
	return id[:i], seq, err == nil
}
