package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"
)

// PostgresDatabase is the database the launcher creates for the tests.
const PostgresDatabase = "keyorder"

// postgresBinDir finds the PostgreSQL server binaries: $KEYORDER_PG_BIN, else
// the newest /usr/lib/postgresql/*/bin with initdb (15 on the project's machines),
// else initdb on PATH.
func postgresBinDir() (string, error) {
	if d := os.Getenv("KEYORDER_PG_BIN"); d != "" {
		return d, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(matches, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(matches[i]))))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(matches[j]))))
		return vi > vj
	})
	if len(matches) > 0 {
		return filepath.Dir(matches[0]), nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("postgres: initdb not found (install postgresql-15, or set KEYORDER_PG_BIN to its bin directory)")
}

// postgresCredential returns the credential to run the server with: PostgreSQL
// refuses to run as root, so as root it runs as user "postgres".
func postgresCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("postgres: running as root and there is no user \"postgres\" to run the server as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

// StartPostgres initialises a new PostgreSQL cluster in o.Dir/postgres (trust
// authentication, superuser "postgres", fsync off), starts it on 127.0.0.1 on a
// free port with its unix socket in the same directory, waits until it accepts
// connections and creates the database "keyorder".
func StartPostgres(ctx context.Context, o Options) (*Server, error) {
	bin, err := postgresBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := postgresCredential()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(o.Dir, Postgres)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	began := time.Now() // start time includes initdb
	data := filepath.Join(dir, "data")
	logPath := filepath.Join(dir, "postgres.log")

	// initdb: no fsync of the new files (-N), trust auth on loopback only.
	initCtx, cancel := context.WithTimeout(ctx, o.startTimeout(2*time.Minute))
	defer cancel()
	initdb := exec.CommandContext(initCtx, filepath.Join(bin, "initdb"),
		"-D", data, "-U", "postgres", "--auth=trust", "-N", "-E", "UTF8", "--locale=C")
	initdb.Dir = dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("postgres: initdb: %v\n%s", err, lastLines(string(out), 30))
	}

	return startWithRetry(ctx, &o, Postgres, 3, func(int) (*Server, error) {
		ports, err := freePorts(1)
		if err != nil {
			return nil, err
		}
		port := ports[0]
		cmd := exec.Command(filepath.Join(bin, "postgres"),
			"-D", data,
			"-p", strconv.Itoa(port),
			"-c", "listen_addresses=127.0.0.1",
			"-c", "unix_socket_directories="+dir,
			"-c", "fsync=off",
			"-c", "synchronous_commit=off",
			"-c", "full_page_writes=off",
			"-c", "max_connections=200",
			"-c", "shared_buffers=128MB",
			"-c", "log_min_messages=warning",
		)
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		// SIGINT is PostgreSQL's "fast shutdown": it ends client sessions.
		p, err := startProc(Postgres, cmd, logPath, syscall.SIGINT, 20*time.Second)
		if err != nil {
			return nil, err
		}
		if cred != nil {
			_ = os.Chown(logPath, int(cred.Uid), int(cred.Gid))
		}
		ready := func(ctx context.Context) error {
			c := exec.CommandContext(ctx, filepath.Join(bin, "pg_isready"), "-q", "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "postgres", "-d", "postgres")
			if err := c.Run(); err != nil {
				return fmt.Errorf("pg_isready: %v", err)
			}
			return nil
		}
		if err := p.waitReady(ctx, o.startTimeout(60*time.Second), ready); err != nil {
			p.stop()
			return nil, err
		}
		cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
		defer ccancel()
		out, err := exec.CommandContext(cctx, filepath.Join(bin, "createdb"), "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "postgres", PostgresDatabase).CombinedOutput()
		if err != nil {
			p.stop()
			return nil, fmt.Errorf("postgres: createdb %s: %v: %s", PostgresDatabase, err, out)
		}
		return &Server{
			Name:          Postgres,
			Settings:      Settings{PostgresURL: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", port, PostgresDatabase)},
			StartDuration: time.Since(began),
			proc:          p,
		}, nil
	})
}
