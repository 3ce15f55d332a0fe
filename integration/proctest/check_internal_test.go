package proctest

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/internal/driverkit"
)

// recorder is a testing.TB that keeps what check reports.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper()             {}
func (r *recorder) Logf(string, ...any) {}
func (r *recorder) Errorf(format string, a ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, a...))
}

// rec is a record: "start" or "ok"/"fail" (an end) of id's attempt in
// process proc at time at.
func rec(proc int, what, id string, attempt int, at int64) record {
	return record{start: what == "start", id: id, attempt: attempt, at: at, ok: what == "ok", proc: proc}
}

// runCheck runs check on rs from processes that ended at ends, with the
// messages dead lists dead-lettered, and returns its errors.
func runCheck(t *testing.T, rs []record, ends []int64, dead ...string) []string {
	t.Helper()
	procs := make([]*process, len(ends))
	for i, at := range ends {
		procs[i] = &process{index: i, endAt: at}
	}
	var dls []keyorder.DeadLetter
	for _, id := range dead {
		dls = append(dls, keyorder.DeadLetter{Message: keyorder.Message{ID: id}, Reason: "attempts exhausted", Attempts: 2})
	}
	r := &recorder{TB: t}
	check(r, Scenario{MaxAttempts: 2}, "", rs, procs, dls, &Result{})
	return r.errs
}

// TestCheckCompletedThenRedeliveredAndDeadLettered is the shape of an SQS
// TestCrashChaos failure (k76, k94): process 0 ran k-000 and k-001 to
// completion and started k-002, then was killed before its deletes landed;
// SQS redelivered the group in order, k-001's redelivery failed twice and
// was dead-lettered, and k-002 ran after it. Every start of k-002 came
// after k-001 completed (in process 0) or was dead-lettered (in process
// 1): no order violation. The checker used to take a dead-lettered
// message's last failed start as its release even when an earlier run had
// completed it, and flagged process 0's k-002.
func TestCheckCompletedThenRedeliveredAndDeadLettered(t *testing.T) {
	rs := []record{
		rec(0, "start", "k-000", 1, 10), rec(0, "ok", "k-000", 1, 11),
		rec(0, "start", "k-001", 1, 12), rec(0, "ok", "k-001", 1, 13),
		rec(0, "start", "k-002", 1, 14), rec(0, "ok", "k-002", 1, 15),
		// process 0 killed at 20, its deletes cut off
		rec(1, "start", "k-000", 1, 100), rec(1, "ok", "k-000", 1, 101),
		rec(1, "start", "k-001", 1, 102), rec(1, "fail", "k-001", 1, 103),
		rec(1, "start", "k-001", 2, 104), rec(1, "fail", "k-001", 2, 105),
		rec(1, "start", "k-002", 1, 110), rec(1, "ok", "k-002", 1, 111),
	}
	if errs := runCheck(t, rs, []int64{20, 200}, "k-001"); len(errs) > 0 {
		t.Errorf("check reported %q, want nothing", errs)
	}
}

// TestCheckStaleDuplicate is the shape of a PostgreSQL TestCrashChaos run:
// process 0 failed k-000, stalled, and lost its lease; process 1 ran
// k-000 to completion; process 0 then ran its retry of k-000 (a stale
// duplicate: delivery is at least once), failed, and went on with k-001.
// k-000 had completed before k-001 started: no violation.
func TestCheckStaleDuplicate(t *testing.T) {
	rs := []record{
		rec(0, "start", "k-000", 1, 10), rec(0, "fail", "k-000", 1, 11),
		rec(1, "start", "k-000", 2, 30), rec(1, "ok", "k-000", 2, 31),
		rec(0, "start", "k-000", 2, 60), rec(0, "fail", "k-000", 2, 61),
		rec(0, "start", "k-001", 1, 62), rec(0, "ok", "k-001", 1, 63),
	}
	if errs := runCheck(t, rs, []int64{200, 40}); len(errs) > 0 {
		t.Errorf("check reported %q, want nothing", errs)
	}
}

// TestCheckDeadLetteredAfterCrashes: a message whose runs were all cut by
// its process's death, dead-lettered after the last, releases its key.
func TestCheckDeadLetteredAfterCrashes(t *testing.T) {
	rs := []record{
		rec(0, "start", "k-000", 1, 10),
		rec(1, "start", "k-000", 2, 30),
		rec(2, "start", "k-001", 1, 50), rec(2, "ok", "k-001", 1, 51),
	}
	if errs := runCheck(t, rs, []int64{20, 40, 200}, "k-000"); len(errs) > 0 {
		t.Errorf("check reported %q, want nothing", errs)
	}
}

// TestCheckFlagsOvertaking: the violations the checker exists for are
// still reported.
func TestCheckFlagsOvertaking(t *testing.T) {
	for _, c := range []struct {
		name string
		rs   []record
		dead []string
		want string
	}{{
		name: "started before the earlier message completed, in another process",
		rs: []record{
			rec(0, "start", "k-000", 1, 10), rec(0, "ok", "k-000", 1, 30),
			rec(1, "start", "k-001", 1, 20), rec(1, "ok", "k-001", 1, 21),
		},
		want: "k-001@1 (process 1) started before k-000 completed",
	}, {
		name: "started between the failed runs of a message dead-lettered without completing",
		rs: []record{
			rec(0, "start", "k-000", 1, 10), rec(0, "fail", "k-000", 1, 11),
			rec(1, "start", "k-001", 1, 12), rec(1, "ok", "k-001", 1, 13),
			rec(0, "start", "k-000", 2, 14), rec(0, "fail", "k-000", 2, 15),
		},
		dead: []string{"k-000"},
		want: "k-001@1 (process 1) started before k-000 completed",
	}, {
		name: "started after a failure that was retried and completed later",
		rs: []record{
			rec(0, "start", "k-000", 1, 10), rec(0, "fail", "k-000", 1, 11),
			rec(1, "start", "k-001", 1, 12), rec(1, "ok", "k-001", 1, 13),
			rec(0, "start", "k-000", 2, 14), rec(0, "ok", "k-000", 2, 15),
		},
		want: "k-001@1 (process 1) started before k-000 completed",
	}, {
		name: "started while an attempt of the key ran in a killed process",
		rs: []record{
			rec(0, "start", "k-000", 1, 10),
			rec(1, "start", "k-000", 2, 12), rec(1, "ok", "k-000", 2, 13),
		},
		want: "k-000@2 (process 1) started while k-000@1 (process 0) ran",
	}, {
		name: "overtook a completed message's failed redelivery",
		rs: []record{
			rec(0, "start", "k-000", 1, 10), rec(0, "ok", "k-000", 1, 11),
			// process 0 killed at 20 before its delete landed
			rec(1, "start", "k-000", 1, 100), rec(1, "fail", "k-000", 1, 101),
			rec(1, "start", "k-001", 1, 102), rec(1, "ok", "k-001", 1, 103),
			rec(1, "start", "k-000", 2, 104), rec(1, "ok", "k-000", 2, 105),
		},
		want: "k-001@1 (process 1) started after k-000@1 failed there and before it ran there again",
	}} {
		t.Run(c.name, func(t *testing.T) {
			errs := runCheck(t, c.rs, []int64{50, 101, 200}, c.dead...)
			if len(errs) == 0 || !strings.Contains(strings.Join(errs, "\n"), c.want) {
				t.Errorf("check reported %q, want an error containing %q", errs, c.want)
			}
		})
	}
}

// TestCheckRecordedStartThatNeverRan is the shape of a Pub/Sub
// TestPoisonKillsProcess failure (k37-001, MaxAttempts 3): k-001 ran in
// process 0, which died; process 1 received it suspect, recorded its start
// before the handler (driverkit.LogRecordingFirst) and died, exited by the
// poison in another goroutine, before the handler began; process 2 ran it
// at attempt 3 and died before its ack landed, and process 3 dead-lettered
// it unrun. The store counted 3 starts: the dead letter is not early. The
// same records without process 1's log line (the store never written) are.
func TestCheckRecordedStartThatNeverRan(t *testing.T) {
	dir := t.TempDir()
	rs := []record{
		rec(0, "start", "k-000", 1, 5), rec(0, "ok", "k-000", 1, 6),
		rec(0, "start", "k-001", 1, 10),
		rec(2, "start", "k-001", 3, 30), rec(2, "ok", "k-001", 3, 31),
	}
	procs := make([]*process, 4)
	for i := range procs {
		procs[i] = &process{index: i, endAt: int64(20 + 10*i), records: fmt.Sprintf("%s/records-%03d", dir, i)}
	}
	dead := []keyorder.DeadLetter{{Message: keyorder.Message{ID: "k-001"}, Reason: "attempts exhausted (3) by lost leases", Attempts: 4}}
	check3 := func() []string {
		r := &recorder{TB: t}
		check(r, Scenario{MaxAttempts: 3}, "", rs, procs, dead, &Result{})
		return r.errs
	}
	if errs := check3(); len(errs) != 1 || !strings.Contains(errs[0], "dead-lettered unrun or early") {
		t.Fatalf("without the recorded start: errors %q, want one early dead letter", errs)
	}
	line := func(id string) string {
		return fmt.Sprintf("time=2026-12-05T08:56:10.000Z level=DEBUG msg=%q subscription=s id=%s copy=123\n", driverkit.LogRecordingFirst, id)
	}
	// Process 1 recorded k-001's start and died; process 2 recorded it too,
	// and its handler ran (the line is matched by its start record).
	if err := os.WriteFile(procs[1].records+".log", []byte(line("k-001")+line("k-002")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(procs[2].records+".log", []byte(line("k-001")), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := recordedUnstarted(procs, rs); got["k-001"] != 1 || len(got) != 2 {
		t.Fatalf("recordedUnstarted = %v, want k-001:1 (process 1) and k-002:1", got)
	}
	if errs := check3(); len(errs) != 0 {
		t.Fatalf("with process 1's recorded start: errors %q, want none", errs)
	}
}
