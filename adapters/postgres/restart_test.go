package postgres_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// cluster is a private PostgreSQL cluster this test can restart.
type cluster struct {
	bin, dir, url string
	opts          string
	uid, gid      int
}

func pgBinDir() string {
	if d := os.Getenv("KEYORDER_PG_BIN"); d != "" && fileExists(filepath.Join(d, "initdb")) {
		return d
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := string(out[:len(out)-1]); fileExists(filepath.Join(d, "initdb")) {
			return d
		}
	}
	ds, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.Sort(ds)
	for i := len(ds) - 1; i >= 0; i-- {
		if fileExists(filepath.Join(ds[i], "initdb")) {
			return ds[i]
		}
	}
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func startCluster(t *testing.T) *cluster {
	t.Helper()
	requirePG(t) // the same gate as every PostgreSQL test
	bin := pgBinDir()
	if bin == "" {
		t.Skip("no PostgreSQL server binaries (initdb) on this machine")
	}
	dir, err := os.MkdirTemp("", "keyorder-pg-")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{bin: bin, dir: dir, uid: -1}
	if os.Geteuid() == 0 { // initdb refuses to run as root
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Skip("running as root without a postgres user to run the server")
		}
		c.uid, _ = strconv.Atoi(u.Uid)
		c.gid, _ = strconv.Atoi(u.Gid)
		if err := os.Chown(dir, c.uid, c.gid); err != nil {
			t.Fatal(err)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	c.opts = fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", port, dir)
	c.url = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres", port)
	c.run(t, "initdb", "-D", dir+"/data", "-A", "trust", "-U", "postgres")
	c.run(t, "pg_ctl", "-D", dir+"/data", "-l", dir+"/log", "-o", c.opts, "-w", "start")
	t.Cleanup(func() {
		cmd := c.cmd("pg_ctl", "-D", dir+"/data", "-m", "immediate", "-w", "stop")
		_ = cmd.Run()
		os.RemoveAll(dir)
	})
	return c
}

func (c *cluster) cmd(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(c.bin, name), args...)
	if c.uid >= 0 {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", filepath.Join(c.bin, name)}, args...)...)
	}
	return cmd
}

func (c *cluster) run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := c.cmd(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", name, err, out)
	}
}

// PostgreSQL restarted mid-stream: the publisher and the subscriber see
// errors classified as retryable, reconnect (the pool and the listener) and
// go on; nothing is lost and each key's messages are first received in
// publish order.
func TestPostgresRestartMidStream(t *testing.T) {
	c := startCluster(t)
	ctx := ctxT(t, 120*time.Second)
	pool, err := pgxpool.New(ctx, c.url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	opts := &postgres.Options{Migrate: true, Create: true, Lease: 2 * time.Second, PollInterval: 100 * time.Millisecond,
		Subscription: &postgres.SubscriptionOptions{Ordering: policy.Ordered}}
	tp, err := postgres.OpenTopicDriver(ctx, pool, "t", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	sub, err := postgres.OpenSubscriptionDriver(ctx, pool, "t", "s", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()

	const keys, perKey = 20, 60
	order := map[string][]string{}
	var batches [][]*driver.Message
	for r := range perKey {
		for k := range keys {
			key := "k" + strconv.Itoa(k)
			id := fmt.Sprintf("%s-%03d", key, r)
			order[key] = append(order[key], id)
			batches = append(batches, []*driver.Message{msg(key, id)})
		}
	}
	var mu sync.Mutex
	received := map[string][]string{}
	distinct := map[string]bool{}
	var pubErrs, subErrs int
	var wg sync.WaitGroup
	published := make(chan int, len(batches))
	wg.Go(func() { // the publisher retries what the driver classifies retryable
		for i, b := range batches {
			for {
				err := tp.SendBatch(ctx, b)
				if err == nil {
					break
				}
				if !tp.IsRetryable(err) || ctx.Err() != nil {
					t.Errorf("publish %s: %v (retryable %v)", b[0].ID, err, tp.IsRetryable(err))
					return
				}
				pubErrs++
				time.Sleep(50 * time.Millisecond) // backoff before retrying
			}
			published <- i
		}
	})
	wg.Go(func() {
		for ctx.Err() == nil {
			mu.Lock()
			n := len(distinct)
			mu.Unlock()
			if n == keys*perKey {
				return
			}
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			ms, err := sub.Receive(rctx, 50)
			cancel()
			if err != nil {
				if rctx.Err() == nil && !sub.IsRetryable(err) {
					t.Errorf("receive: %v (not retryable)", err)
					return
				}
				subErrs++
				time.Sleep(20 * time.Millisecond) // backoff: the server may be down
				continue
			}
			mu.Lock()
			for _, m := range ms {
				received[m.Key] = append(received[m.Key], m.ID)
				distinct[m.ID] = true
			}
			mu.Unlock()
			if err := sub.Ack(ctx, ms); err != nil && !sub.IsRetryable(err) {
				t.Errorf("ack: %v (not retryable)", err)
				return
			}
		}
	})
	// Restart once a third has been published.
	for i := range published {
		if i >= len(batches)/3 {
			break
		}
	}
	c.run(t, "pg_ctl", "-D", c.dir+"/data", "-l", c.dir+"/log", "-o", c.opts, "-m", "fast", "-w", "restart")
	wg.Wait()
	t.Logf("publish errors retried: %d; receive errors: %d", pubErrs, subErrs)
	if len(distinct) != keys*perKey {
		t.Fatalf("received %d distinct of %d", len(distinct), keys*perKey)
	}
	for key, ids := range received {
		var first []string
		for _, id := range ids {
			if !slices.Contains(first, id) {
				first = append(first, id)
			}
		}
		if !slices.Equal(first, order[key]) {
			t.Fatalf("key %s: first received in order %v, published %v", key, first, order[key])
		}
	}
}
