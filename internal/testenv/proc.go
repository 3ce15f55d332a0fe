package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options configure how servers are started.
type Options struct {
	// Dir is the directory each server keeps its data and log in (one
	// subdirectory per server). Required.
	Dir string
	// RepoRoot is the root of the keyorder repository; the Java servers'
	// poms and config files are read from RepoRoot/integration/java.
	RepoRoot string
	// StartTimeout bounds the wait for one server to become ready, after its
	// artifacts are resolved. Zero means a per-server default.
	StartTimeout time.Duration
	// ResolveTimeout bounds the Maven resolution of a Java server's
	// artifacts (a cold ~/.m2 downloads about 250 MB). Zero means 20 minutes.
	ResolveTimeout time.Duration
	// MavenArgs are extra arguments for every mvn call, e.g.
	// -Dmaven.repo.local=/tmp/m2 (also taken from $KEYORDER_MVN_ARGS).
	MavenArgs []string
	// Log receives progress lines. Nil means os.Stderr.
	Log io.Writer
}

var logMu sync.Mutex // servers start and stop in parallel; o.Log need not be safe for that

func (o *Options) logf(format string, args ...any) {
	w := o.Log
	if w == nil {
		w = os.Stderr
	}
	logMu.Lock()
	defer logMu.Unlock()
	fmt.Fprintf(w, "testenv: "+format+"\n", args...)
}

func (o *Options) startTimeout(def time.Duration) time.Duration {
	if o.StartTimeout > 0 {
		return o.StartTimeout
	}
	return def
}

// Server is a running server started by this package.
type Server struct {
	Name string
	// Settings holds this server's connection settings (other fields empty).
	Settings Settings
	// StartDuration is the time from launching the process until it was
	// ready (not counting artifact resolution).
	StartDuration time.Duration
	// ResolveDuration is the time spent resolving artifacts (Java servers).
	ResolveDuration time.Duration

	proc *proc
}

// PID is the process id of the server's main process (also its process group).
func (s *Server) PID() int { return s.proc.pid() }

// RSS returns the resident memory of the server's process tree in bytes.
func (s *Server) RSS() int64 { return treeRSS(s.proc.pid()) }

// LogPath is the file the server's stdout and stderr go to.
func (s *Server) LogPath() string { return s.proc.logPath }

// Stop stops the server: its stop signal, then SIGKILL to its process group
// after the grace period. It waits until the process has exited.
func (s *Server) Stop() error { return s.proc.stop() }

// proc is one child process in its own process group.
type proc struct {
	name     string
	cmd      *exec.Cmd
	logPath  string
	logFile  *os.File
	stopSig  syscall.Signal
	grace    time.Duration
	done     chan struct{} // closed when the process has exited and was reaped
	waitErr  error
	stopOnce sync.Once
	stopErr  error
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// startProc starts cmd in its own process group with stdout/stderr appended to
// logPath. The child gets SIGKILL if this process dies (Pdeathsig), so a
// launcher killed with SIGKILL leaves no server behind.
func startProc(name string, cmd *exec.Cmd, logPath string, stopSig syscall.Signal, grace time.Duration) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.Stdin = nil
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: start %s: %w", name, cmd.Path, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, logFile: f, stopSig: stopSig, grace: grace, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends the stop signal to the main process, waits up to the grace period,
// then kills the whole process group. Only this process group is signalled.
func (p *proc) stop() error {
	p.stopOnce.Do(func() {
		pgid := p.pid()
		// Processes that left the group (PostgreSQL's children call setsid)
		// are found through the process tree.
		var snapshot map[int]uint64
		if !p.exited() {
			snapshot = tree(pgid)
			delete(snapshot, pgid)
			_ = syscall.Kill(pgid, p.stopSig)
			select {
			case <-p.done:
			case <-time.After(p.grace):
				p.stopErr = fmt.Errorf("%s: did not stop within %s after %s; killed", p.name, p.grace, p.stopSig)
				_ = syscall.Kill(-pgid, syscall.SIGKILL)
				<-p.done
			}
		}
		// Anything the server left in its group (postgres backends, JVM
		// helpers) goes too. ESRCH (nothing left) is the normal case.
		killGroupAndWait(pgid, 5*time.Second)
		killLeftovers(snapshot, 5*time.Second)
	})
	return p.stopErr
}

// killGroupAndWait SIGKILLs process group pgid and waits until it is empty.
func killGroupAndWait(pgid int, max time.Duration) {
	deadline := time.Now().Add(max)
	for {
		if err := syscall.Kill(-pgid, syscall.SIGKILL); errors.Is(err, syscall.ESRCH) {
			return
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitReady polls check until it returns nil, the process exits, or the
// timeout passes. On failure the error includes the tail of the server's log.
func (p *proc) waitReady(ctx context.Context, timeout time.Duration, check func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	delay := 50 * time.Millisecond
	var last error
	for {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		last = check(cctx)
		ccancel()
		if last == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%w: %s exited before it was ready (%v); last check: %v\n%s", errExitedEarly, p.name, p.waitErr, last, p.tail())
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return fmt.Errorf("%s: start cancelled: %w", p.name, ctx.Err())
			}
			return fmt.Errorf("%s not ready after %s: %v\n%s", p.name, timeout, last, p.tail())
		case <-time.After(delay):
		}
		if delay < 500*time.Millisecond {
			delay *= 2
		}
	}
}

// tail returns the last lines of the server's log, framed for an error message.
func (p *proc) tail() string {
	return fmt.Sprintf("--- last lines of %s ---\n%s--- end of %s ---", p.logPath, logTail(p.logPath, 60), p.logPath)
}

func logTail(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)\n", err)
	}
	b = bytes.TrimRight(b, "\n")
	parts := bytes.Split(b, []byte("\n"))
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	return string(bytes.Join(parts, []byte("\n"))) + "\n"
}

// freePorts returns n distinct free TCP ports on 127.0.0.1. There is a small
// window in which another process could take one; start functions retry with
// new ports when a server exits early.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// procInfo reads the parent pid and start time (clock ticks since boot) of pid.
func procInfo(pid int) (ppid int, start uint64, ok bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, false
	}
	// The command name (field 2) is in parentheses and may contain spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); ppid is field 4, starttime field 22.
	if len(f) < 20 {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	start, _ = strconv.ParseUint(f[19], 10, 64)
	return ppid, start, true
}

// tree returns pid and all its descendants, each with its start time (to
// recognise it later without mistaking a reused pid for it).
func tree(pid int) map[int]uint64 {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	starts := map[int]uint64{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		pp, st, ok := procInfo(p)
		if !ok {
			continue
		}
		children[pp] = append(children[pp], p)
		starts[p] = st
	}
	out := map[int]uint64{}
	var walk func(int)
	walk = func(p int) {
		st, ok := starts[p]
		if !ok {
			return
		}
		out[p] = st
		for _, c := range children[p] {
			walk(c)
		}
	}
	walk(pid)
	return out
}

// treeRSS sums VmRSS over pid and its descendants, in bytes.
func treeRSS(pid int) int64 {
	var total int64
	for p := range tree(pid) {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				if f := strings.Fields(rest); len(f) >= 1 {
					kb, _ := strconv.ParseInt(f[0], 10, 64)
					total += kb * 1024
				}
			}
		}
	}
	return total
}

// killLeftovers SIGKILLs those processes of snapshot that still run (same pid
// and start time) after waiting up to grace for them to exit by themselves.
func killLeftovers(snapshot map[int]uint64, grace time.Duration) {
	alive := func() []int {
		var out []int
		for p, st := range snapshot {
			if _, st2, ok := procInfo(p); ok && st2 == st {
				out = append(out, p)
			}
		}
		return out
	}
	deadline := time.Now().Add(grace)
	for {
		left := alive()
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, p := range left {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// javaCmd returns the java executable: $JAVA_HOME/bin/java if set, else java
// from PATH.
func javaCmd() (string, error) {
	if h := os.Getenv("JAVA_HOME"); h != "" {
		p := filepath.Join(h, "bin", "java")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("java")
	if err != nil {
		return "", errors.New("java not found (set JAVA_HOME or put java 17+ on PATH)")
	}
	return p, nil
}

// startWithRetry runs start up to attempts times while it fails with a server
// that exited early (typically a port taken between choosing and binding it).
func startWithRetry(ctx context.Context, o *Options, name string, attempts int, start func(attempt int) (*Server, error)) (*Server, error) {
	var err error
	for i := 1; i <= attempts; i++ {
		var s *Server
		s, err = start(i)
		if err == nil {
			return s, nil
		}
		if ctx.Err() != nil || !errors.Is(err, errExitedEarly) || i == attempts {
			break
		}
		o.logf("%s: attempt %d failed, retrying with new ports: %v", name, i, firstLine(err.Error()))
	}
	return nil, err
}

var errExitedEarly = errors.New("server exited early")

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
