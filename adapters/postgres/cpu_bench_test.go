package postgres_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// cpuMeter measures the CPU a benchmark's timed part costs per message: on a
// machine shared with other work msgs/s swings by 2-3x between runs, the
// CPU per message much less. It reads /proc (Linux): this process's CPU and,
// when the server runs on this machine with a readable data directory (as
// the test launcher starts it), the PostgreSQL server's, its exited
// backends' included. Elsewhere the metrics are left out.
type cpuMeter struct {
	postmaster   string
	self, server time.Duration
}

func startCPU(e *env) *cpuMeter {
	m := &cpuMeter{}
	var dir string
	if err := e.pool.QueryRow(context.Background(), "SHOW data_directory").Scan(&dir); err == nil {
		if b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid")); err == nil {
			m.postmaster, _, _ = strings.Cut(string(b), "\n")
		}
	}
	m.self, m.server = procCPU("self", false), m.serverCPU()
	return m
}

// report adds cpu-us/msg (this process) and server-cpu-us/msg.
func (m *cpuMeter) report(b *testing.B, n int) {
	per := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(n) }
	if self := procCPU("self", false); self >= 0 && m.self >= 0 {
		b.ReportMetric(per(self-m.self), "cpu-us/msg")
	}
	if srv := m.serverCPU(); srv >= 0 && m.server >= 0 {
		b.ReportMetric(per(srv-m.server), "server-cpu-us/msg")
	}
}

// serverCPU sums the postmaster's CPU, its reaped children's and its live
// children's; -1 when unknown.
func (m *cpuMeter) serverCPU() time.Duration {
	if m.postmaster == "" {
		return -1
	}
	total := procCPU(m.postmaster, true)
	if total < 0 {
		return -1
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return -1
	}
	for _, e := range ents {
		if f := procStat(e.Name()); len(f) > 12 && f[1] == m.postmaster {
			total += ticks(f[11:13])
		}
	}
	return total
}

// procCPU returns a process's user+system CPU (with its reaped children's
// when children is set); -1 when unknown.
func procCPU(pid string, children bool) time.Duration {
	f := procStat(pid)
	if len(f) < 15 {
		return -1
	}
	if children {
		return ticks(f[11:15])
	}
	return ticks(f[11:13])
}

// procStat returns the fields of /proc/<pid>/stat after "(comm)": state,
// ppid, ...; utime is index 11.
func procStat(pid string) []string {
	if _, err := strconv.Atoi(pid); err != nil && pid != "self" {
		return nil
	}
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return nil
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

func ticks(fs []string) time.Duration {
	var t int64
	for _, s := range fs {
		v, _ := strconv.ParseInt(s, 10, 64)
		t += v
	}
	return time.Duration(t) * time.Second / 100 // USER_HZ is 100 on Linux
}
