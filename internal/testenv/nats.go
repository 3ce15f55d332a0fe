package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// NATSServerVersion is the nats-server release testenv builds and runs.
const NATSServerVersion = "v2.15.3"

// natsServerBinary returns the path of a nats-server binary:
// $KEYORDER_NATS_SERVER when set, else the one built from the Go module
// github.com/nats-io/nats-server/v2@NATSServerVersion into
// ~/.cache/keyorder/nats-server-<version>/, building it first when it is
// missing (go install through the module proxy; about a minute on 2 cores
// the first time, nothing afterwards). Concurrent launchers are serialised
// with a lock file.
func natsServerBinary(ctx context.Context, o *Options) (string, time.Duration, error) {
	if p := os.Getenv("KEYORDER_NATS_SERVER"); p != "" {
		return p, 0, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", 0, err
	}
	dir := filepath.Join(cache, "keyorder", "nats-server-"+NATSServerVersion)
	bin := filepath.Join(dir, "nats-server")
	if _, err := os.Stat(bin); err == nil {
		return bin, 0, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", 0, err
	}
	unlock, err := lockFile(ctx, dir+".lock")
	if err != nil {
		return "", 0, err
	}
	defer unlock()
	if _, err := os.Stat(bin); err == nil {
		return bin, 0, nil
	}
	began := time.Now()
	bctx, cancel := context.WithTimeout(ctx, resolveTimeout(o))
	defer cancel()
	cmd := exec.CommandContext(bctx, "go", "install", "github.com/nats-io/nats-server/v2@"+NATSServerVersion)
	// Outside any module, so the repository's go.work plays no part.
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOWORK=off", "GOFLAGS=-mod=mod", "CGO_ENABLED=0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", 0, fmt.Errorf("nats: build nats-server %s: %w\n%s", NATSServerVersion, err, lastLines(string(out), 40))
	}
	o.logf("nats: built nats-server %s into %s in %.1fs", NATSServerVersion, dir, time.Since(began).Seconds())
	return bin, time.Since(began), nil
}

// StartNATS starts nats-server (built from its Go module, see
// natsServerBinary) with JetStream on o.Dir/nats, listening on 127.0.0.1
// on a free port with its monitoring endpoint on another, and waits until
// the monitoring endpoint's /healthz?js-enabled-only=true answers ok
// (JetStream ready).
func StartNATS(ctx context.Context, o Options) (*Server, error) {
	bin, built, err := natsServerBinary(ctx, &o)
	if err != nil {
		return nil, err
	}
	return startWithRetry(ctx, &o, NATS, 3, func(attempt int) (*Server, error) {
		dir := filepath.Join(o.Dir, NATS, strconv.Itoa(attempt))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		ports, err := freePorts(2)
		if err != nil {
			return nil, err
		}
		began := time.Now()
		cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", strconv.Itoa(ports[0]),
			"-m", strconv.Itoa(ports[1]), "-js", "-sd", filepath.Join(dir, "js"), "-n", "keyorder-testenv")
		cmd.Dir = dir
		p, err := startProc(NATS, cmd, filepath.Join(dir, "nats.log"), syscall.SIGTERM, 15*time.Second)
		if err != nil {
			return nil, err
		}
		health := fmt.Sprintf("http://127.0.0.1:%d/healthz?js-enabled-only=true", ports[1])
		ready := func(ctx context.Context) error {
			body, err := httpGet(ctx, health)
			if err != nil {
				return err
			}
			var h struct{ Status string }
			if err := json.Unmarshal([]byte(body), &h); err != nil || h.Status != "ok" {
				return fmt.Errorf("GET %s: %q", health, body)
			}
			return nil
		}
		if err := p.waitReady(ctx, o.startTimeout(60*time.Second), ready); err != nil {
			p.stop()
			return nil, err
		}
		return &Server{
			Name:            NATS,
			Settings:        Settings{NATSURL: fmt.Sprintf("nats://127.0.0.1:%d", ports[0])},
			StartDuration:   time.Since(began),
			ResolveDuration: built,
			proc:            p,
		}, nil
	})
}
