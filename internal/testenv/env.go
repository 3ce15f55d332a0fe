package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

const (
	dirPrefix = "keyorder-testenv-"
	pidFile   = "launcher.pid"
)

// removeStaleDirs removes data directories left in the temp dir by launchers
// that were killed (SIGKILL leaves no chance to clean up; their servers died
// with them through Pdeathsig). A directory whose launcher still runs is kept.
func removeStaleDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, pidFile))
		if err != nil {
			continue // not ours, or still being set up
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); err == nil || errors.Is(err, syscall.EPERM) {
			continue // launcher alive
		}
		_ = os.RemoveAll(d)
	}
}

// StartFunc starts one server.
type StartFunc func(ctx context.Context, o Options) (*Server, error)

// Starters maps each server name to its start function.
var Starters = map[string]StartFunc{
	Postgres: StartPostgres,
	PubSub:   StartPubSub,
	SQS:      StartSQS,
	Pulsar:   StartPulsar,
	Kafka:    StartKafka,
	NATS:     StartNATS,
}

// Env is a set of running servers.
type Env struct {
	Servers  []*Server // in the order of the names passed to Start
	Settings Settings  // all servers' settings together
	Dir      string
	keepDir  bool
	o        Options
}

// ParseServers turns "postgres,pulsar" into a checked list; "" or "all" means
// AllServers.
func ParseServers(list string) ([]string, error) {
	list = strings.TrimSpace(list)
	if list == "" || list == "all" {
		return append([]string(nil), AllServers...), nil
	}
	seen := map[string]bool{}
	var out []string
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if n == "" || seen[n] {
			continue
		}
		if _, ok := Starters[n]; !ok {
			return nil, fmt.Errorf("unknown server %q (known: %s)", n, strings.Join(AllServers, ","))
		}
		seen[n] = true
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("no servers named")
	}
	return out, nil
}

// Start starts the named servers in parallel, each with its data under a new
// temporary directory (o.Dir if set). If any fails, the others are stopped and
// the error is returned (with the failing server's log tail). keepDir keeps the
// directory after Stop.
func Start(ctx context.Context, o Options, names []string, keepDir bool) (*Env, error) {
	if o.RepoRoot == "" {
		root, err := FindRepoRoot()
		if err != nil {
			return nil, err
		}
		o.RepoRoot = root
	}
	if o.Dir == "" {
		removeStaleDirs()
		d, err := os.MkdirTemp("", dirPrefix)
		if err != nil {
			return nil, err
		}
		o.Dir = d
	}
	// PostgreSQL runs as user postgres when we are root: let it reach its
	// subdirectory (the directory itself stays unreadable to others).
	if err := os.Chmod(o.Dir, 0o711); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(o.Dir, pidFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, err
	}
	e := &Env{Dir: o.Dir, keepDir: keepDir, o: o}

	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		i   int
		s   *Server
		err error
	}
	results := make(chan result, len(names))
	for i, n := range names {
		go func() {
			s, err := Starters[n](ctx, o)
			if err == nil {
				o.logf("%s ready in %.1fs%s (pid %d, log %s)", n, s.StartDuration.Seconds(), resolvedNote(s), s.PID(), s.LogPath())
			} else {
				cancel() // one failed: stop waiting for the others
			}
			results <- result{i, s, err}
		}()
	}
	servers := make([]*Server, len(names))
	var errs []error
	for range names {
		r := <-results
		servers[r.i] = r.s
		if r.err != nil && !(errors.Is(r.err, context.Canceled) && len(errs) > 0) {
			errs = append(errs, r.err)
		}
	}
	for _, s := range servers {
		if s != nil {
			e.Servers = append(e.Servers, s)
		}
	}
	if parent.Err() != nil {
		// Cancelled by the caller (e.g. Ctrl-C): the errors are only echoes of that.
		e.Stop()
		return nil, fmt.Errorf("start-up cancelled: %w", parent.Err())
	}
	if err := errors.Join(errs...); err != nil {
		e.keepDir = true // keep the logs for a look; the next launcher removes the directory
		e.Stop()
		return nil, err
	}
	for _, s := range e.Servers {
		e.Settings = merge(e.Settings, s.Settings)
	}
	return e, nil
}

func resolvedNote(s *Server) string {
	if s.ResolveDuration == 0 {
		return ""
	}
	return fmt.Sprintf(" after %.1fs resolving jars or building", s.ResolveDuration.Seconds())
}

func merge(a, b Settings) Settings {
	pick := func(x, y string) string {
		if y != "" {
			return y
		}
		return x
	}
	return Settings{
		PostgresURL:        pick(a.PostgresURL, b.PostgresURL),
		PubSubEmulatorHost: pick(a.PubSubEmulatorHost, b.PubSubEmulatorHost),
		SQSEndpoint:        pick(a.SQSEndpoint, b.SQSEndpoint),
		PulsarURL:          pick(a.PulsarURL, b.PulsarURL),
		PulsarAdminURL:     pick(a.PulsarAdminURL, b.PulsarAdminURL),
		KafkaBrokers:       pick(a.KafkaBrokers, b.KafkaBrokers),
		NATSURL:            pick(a.NATSURL, b.NATSURL),
	}
}

// Report returns one line per server with its start time and resident memory.
func (e *Env) Report() string {
	var b strings.Builder
	for _, s := range e.Servers {
		fmt.Fprintf(&b, "%-7s start %5.1fs", s.Name, s.StartDuration.Seconds())
		if s.ResolveDuration > 0 {
			fmt.Fprintf(&b, "  (+%.1fs resolving jars or building)", s.ResolveDuration.Seconds())
		}
		fmt.Fprintf(&b, "  rss %4d MiB  pid %d\n", s.RSS()>>20, s.PID())
	}
	return b.String()
}

// Stop stops all servers in parallel and removes the data directory (unless it
// is kept). It returns once every server process has exited.
func (e *Env) Stop() error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for _, s := range e.Servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rss := s.RSS()
			if err := s.Stop(); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
			e.o.logf("%s stopped (rss before stop %d MiB)", s.Name, rss>>20)
		}()
	}
	wg.Wait()
	if e.keepDir {
		e.o.logf("kept server data and logs in %s", e.Dir)
	} else if e.Dir != "" {
		if err := os.RemoveAll(e.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// FindRepoRoot walks up from the working directory to the directory whose
// go.mod declares module github.com/keyorder/keyorder.
func FindRepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains(string(b), "module github.com/keyorder/keyorder\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the keyorder repository root (a go.mod with module github.com/keyorder/keyorder) above the working directory")
		}
		dir = parent
	}
}

// SortedNames returns the names in AllServers order (for stable output).
func SortedNames(names []string) []string {
	idx := map[string]int{}
	for i, n := range AllServers {
		idx[n] = i
	}
	out := append([]string(nil), names...)
	sort.SliceStable(out, func(i, j int) bool { return idx[out[i]] < idx[out[j]] })
	return out
}
