package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// pubsubEmulatorPath finds Google's Pub/Sub emulator launcher:
// $KEYORDER_PUBSUB_EMULATOR, else the Debian package's
// (google-cloud-cli-pubsub-emulator), else cloud-pubsub-emulator on PATH.
func pubsubEmulatorPath() (string, error) {
	if p := os.Getenv("KEYORDER_PUBSUB_EMULATOR"); p != "" {
		return p, nil
	}
	for _, p := range []string{
		"/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator",
		"/usr/share/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator",
	} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("cloud-pubsub-emulator"); err == nil {
		return p, nil
	}
	return "", errors.New("pubsub: Google's Pub/Sub emulator not found (Debian package google-cloud-cli-pubsub-emulator; " +
		"or set KEYORDER_PUBSUB_EMULATOR to its bin/cloud-pubsub-emulator)")
}

// StartPubSub starts Google's Pub/Sub emulator on 127.0.0.1 on a free port
// with its data in o.Dir/pubsub, and waits until it answers HTTP requests.
func StartPubSub(ctx context.Context, o Options) (*Server, error) {
	emu, err := pubsubEmulatorPath()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(o.Dir, PubSub)
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		return nil, err
	}
	return startWithRetry(ctx, &o, PubSub, 3, func(int) (*Server, error) {
		ports, err := freePorts(1)
		if err != nil {
			return nil, err
		}
		port := ports[0]
		began := time.Now()
		cmd := exec.Command(emu, "--host=127.0.0.1", "--port="+strconv.Itoa(port), "--data-dir="+filepath.Join(dir, "data"))
		cmd.Dir = dir
		// The launcher script execs java with $CLOUD_PUBSUB_EMULATOR_OPTS.
		cmd.Env = append(os.Environ(), "CLOUD_PUBSUB_EMULATOR_OPTS=-XX:+UseSerialGC -Xmx512m -XX:-UsePerfData")
		p, err := startProc(PubSub, cmd, filepath.Join(dir, "pubsub.log"), syscall.SIGTERM, 15*time.Second)
		if err != nil {
			return nil, err
		}
		base := fmt.Sprintf("http://127.0.0.1:%d/", port)
		// The emulator answers "Ok" on / once its server is listening.
		ready := func(ctx context.Context) error {
			body, err := httpGet(ctx, base)
			if err != nil {
				return err
			}
			if !strings.HasPrefix(strings.TrimSpace(body), "Ok") {
				return fmt.Errorf("GET %s: unexpected body %q", base, body)
			}
			return nil
		}
		if err := p.waitReady(ctx, o.startTimeout(120*time.Second), ready); err != nil {
			p.stop()
			return nil, err
		}
		return &Server{
			Name:          PubSub,
			Settings:      Settings{PubSubEmulatorHost: fmt.Sprintf("127.0.0.1:%d", port)},
			StartDuration: time.Since(began),
			proc:          p,
		}, nil
	})
}

// httpGet returns the body of a 200 response.
func httpGet(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	return httpDo(req)
}

func httpDo(req *http.Request) (string, error) {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("%s %s: %s: %s", req.Method, req.URL, resp.Status, strings.TrimSpace(string(b)))
	}
	return string(b), nil
}
