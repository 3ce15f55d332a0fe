package testenv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// javaDir is where the Java servers' poms and configs live, relative to the
// repository root.
const javaDir = "integration/java"

// resolveClasspath makes sure the runtime jars of the Maven project in
// integration/java/<name>/pom.xml are copied into
// integration/java/target/<name>-lib and returns that directory's classpath
// ("dir/*"). Maven caches downloads in ~/.m2 (or -Dmaven.repo.local); the copy
// is redone only when the pom or settings change (a stamp file holds their hash).
// Concurrent launchers are serialised with a lock file.
func resolveClasspath(ctx context.Context, o *Options, name string) (string, time.Duration, error) {
	began := time.Now()
	root := filepath.Join(o.RepoRoot, javaDir)
	pom := filepath.Join(root, name, "pom.xml")
	settings := filepath.Join(root, "settings.xml")
	target := filepath.Join(root, "target")
	lib := filepath.Join(target, name+"-lib")
	stampPath := filepath.Join(target, name+"-lib.stamp")

	sum, err := hashFiles(pom, settings)
	if err != nil {
		return "", 0, err
	}
	args := mavenArgs(o)
	stamp := sum + " " + strings.Join(args, " ")
	if err := os.MkdirAll(target, 0o755); err != nil {
		return "", 0, err
	}
	unlock, err := lockFile(ctx, filepath.Join(target, name+".lock"))
	if err != nil {
		return "", 0, err
	}
	defer unlock()

	if b, err := os.ReadFile(stampPath); err == nil && string(b) == stamp {
		if _, err := os.Stat(lib); err == nil {
			return filepath.Join(lib, "*"), time.Since(began), nil
		}
	}

	mvn, err := exec.LookPath("mvn")
	if err != nil {
		return "", 0, fmt.Errorf("%s: mvn (Apache Maven) not found on PATH; it resolves the server's jars from Maven Central", name)
	}
	tmp := lib + ".tmp"
	_ = os.RemoveAll(tmp)
	_ = os.Remove(stampPath)
	o.logf("%s: resolving jars with Maven (downloads into the Maven cache what is not there yet)...", name)
	cmdArgs := append([]string{
		"-B", "-q", "-Dstyle.color=never",
		"-gs", settings,
		"-f", pom,
	}, args...)
	cmdArgs = append(cmdArgs,
		"dependency:copy-dependencies",
		"-DincludeScope=runtime",
		"-Dmdep.prependGroupId=true",
		"-DoutputDirectory="+tmp,
	)
	cmd := exec.CommandContext(ctx, mvn, cmdArgs...)
	cmd.Dir = filepath.Join(root, name)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", 0, fmt.Errorf("%s: mvn %s: %v\n%s", name, strings.Join(cmdArgs, " "), err, lastLines(string(out), 40))
	}
	_ = os.RemoveAll(lib)
	if err := os.Rename(tmp, lib); err != nil {
		return "", 0, err
	}
	if err := os.WriteFile(stampPath, []byte(stamp), 0o644); err != nil {
		return "", 0, err
	}
	return filepath.Join(lib, "*"), time.Since(began), nil
}

func mavenArgs(o *Options) []string {
	args := append([]string(nil), o.MavenArgs...)
	args = append(args, strings.Fields(os.Getenv("KEYORDER_MVN_ARGS"))...)
	return args
}

func hashFiles(paths ...string) (string, error) {
	h := sha256.New()
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", filepath.Base(p), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// lockFile takes an exclusive flock on path, waiting until ctx is done.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if err != syscall.EWOULDBLOCK {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// javaClasspath finds the java command and resolves the classpath of the
// Maven project integration/java/<name>, within the resolution timeout.
func javaClasspath(ctx context.Context, o *Options, name string) (java, cp string, resolved time.Duration, err error) {
	if java, err = javaCmd(); err != nil {
		return "", "", 0, err
	}
	rctx, cancel := context.WithTimeout(ctx, resolveTimeout(o))
	defer cancel()
	cp, resolved, err = resolveClasspath(rctx, o, name)
	return java, cp, resolved, err
}
