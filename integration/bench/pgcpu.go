package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// CPU per message, beside msgs/s: on a machine shared with other work the
// rates swing by 2-3x between runs, while the CPU a phase costs moves much
// less. The suite prints, for each phase, this process's CPU and, when the
// server runs on this machine and its data directory is readable (as the
// test launcher starts it), the PostgreSQL server's: the postmaster's user
// and system time, its exited backends' (reaped children) included, and its
// live backends'. Linux only; elsewhere the server's figure is left out.

// serverCPU reads a local PostgreSQL server's CPU time.
type serverCPU struct {
	pid string // the postmaster's; "" when unknown
}

func newServerCPU(ctx context.Context, pool *pgxpool.Pool) serverCPU {
	var dir string
	if err := pool.QueryRow(ctx, "SHOW data_directory").Scan(&dir); err != nil {
		return serverCPU{}
	}
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return serverCPU{}
	}
	pid, _, _ := strings.Cut(string(b), "\n")
	if _, err := os.Stat("/proc/" + pid + "/stat"); err != nil {
		return serverCPU{}
	}
	return serverCPU{pid: pid}
}

// total returns the server's CPU time so far, or -1.
func (s serverCPU) total() time.Duration {
	if s.pid == "" {
		return -1
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return -1
	}
	var ticks int64
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// After "(comm) ": state, ppid, ... utime is field 14 of the
		// line, stime 15, cutime 16, cstime 17.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 15 {
			continue
		}
		n := 2 // utime, stime
		switch {
		case e.Name() == s.pid:
			n = 4 // and the reaped children's
		case f[1] != s.pid:
			continue
		}
		for _, x := range f[11 : 11+n] {
			v, _ := strconv.ParseInt(x, 10, 64)
			ticks += v
		}
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ is 100 on Linux
}

// cpuSpan is one phase's CPU.
type cpuSpan struct {
	srv          serverCPU
	self, server time.Duration
}

func (s serverCPU) start() cpuSpan { return cpuSpan{srv: s, self: cpuTime(), server: s.total()} }

// report prints the phase's CPU per message.
func (c cpuSpan) report(system, what string, n int) {
	per := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(n) }
	line := fmt.Sprintf("%-14s %-46s CPU/msg: bench %.1f µs", system, what, per(cpuTime()-c.self))
	if c.server >= 0 {
		if now := c.srv.total(); now >= 0 {
			line += fmt.Sprintf(", server %.1f µs", per(now-c.server))
		}
	}
	fmt.Println(line)
}
