package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// pulsarJVMFlags are the JVM options of the standalone broker: a 2 GB heap,
// the serial collector (fewer threads on a 2-core machine) and the module
// opens Pulsar's own launcher script passes on Java 17.
var pulsarJVMFlags = []string{
	"-Xms256m", "-Xmx2g", "-XX:MaxDirectMemorySize=1g",
	"-XX:+UseSerialGC",
	"-XX:-UsePerfData", // no /tmp/hsperfdata files
	"-Dio.netty.tryReflectionSetAccessible=true",
	"-Dio.netty.recycler.maxCapacityPerThread=4096",
	"-Dpulsar.allocator.exit_on_oom=true",
	"--add-opens", "java.base/java.io=ALL-UNNAMED",
	"--add-opens", "java.base/java.util.zip=ALL-UNNAMED",
	"--add-opens", "java.base/sun.net=ALL-UNNAMED",
	"--add-opens", "java.management/sun.management=ALL-UNNAMED",
	"--add-opens", "jdk.management/com.sun.management.internal=ALL-UNNAMED",
	"--add-opens", "java.base/jdk.internal.misc=ALL-UNNAMED",
	"--add-opens", "java.base/jdk.internal.platform=ALL-UNNAMED",
	"--add-opens", "java.base/java.nio=ALL-UNNAMED",
}

// StartPulsar starts an Apache Pulsar standalone broker
// (org.apache.pulsar:pulsar-broker, resolved with Maven from
// integration/java/pulsar/pom.xml) with RocksDB metadata and one in-process
// bookie, all data in o.Dir/pulsar. The broker and admin ports are free ports
// on 127.0.0.1, appended to a copy of integration/java/pulsar/standalone.conf.
// It waits until the admin API's broker health check (which writes and reads a
// message) passes and the default namespace public/default exists.
func StartPulsar(ctx context.Context, o Options) (*Server, error) {
	java, cp, resolved, err := javaClasspath(ctx, &o, "pulsar")
	if err != nil {
		return nil, fmt.Errorf("pulsar: %w", err)
	}
	src := filepath.Join(o.RepoRoot, javaDir, "pulsar")
	baseConf, err := os.ReadFile(filepath.Join(src, "standalone.conf"))
	if err != nil {
		return nil, err
	}
	return startWithRetry(ctx, &o, Pulsar, 3, func(attempt int) (*Server, error) {
		dir := filepath.Join(o.Dir, Pulsar, strconv.Itoa(attempt))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		ports, err := freePorts(2)
		if err != nil {
			return nil, err
		}
		brokerPort, webPort := ports[0], ports[1]
		conf := filepath.Join(dir, "standalone.conf")
		extra := fmt.Sprintf("\n# Added by internal/testenv\nbrokerServicePort=%d\nwebServicePort=%d\n", brokerPort, webPort)
		if err := os.WriteFile(conf, append(append([]byte(nil), baseConf...), extra...), 0o644); err != nil {
			return nil, err
		}
		began := time.Now()
		args := append(append([]string(nil), pulsarJVMFlags...),
			"-Dlog4j.configurationFile="+filepath.Join(src, "log4j2.xml"),
			"-cp", cp,
			"org.apache.pulsar.PulsarStandaloneStarter",
			"-c", conf,
			"--no-functions-worker",
			"--no-stream-storage",
			"--metadata-dir", filepath.Join(dir, "data", "metadata"),
			"--bookkeeper-dir", filepath.Join(dir, "data", "bookkeeper"),
			// Must not exist: its absence selects RocksDB metadata (no ZooKeeper).
			"--zookeeper-dir", filepath.Join(dir, "data", "zookeeper"),
			"--bookkeeper-port", "0",
		)
		cmd := exec.Command(java, args...)
		cmd.Dir = dir
		p, err := startProc(Pulsar, cmd, filepath.Join(dir, "pulsar.log"), syscall.SIGTERM, 30*time.Second)
		if err != nil {
			return nil, err
		}
		admin := fmt.Sprintf("http://127.0.0.1:%d", webPort)
		ready := func(ctx context.Context) error {
			body, err := httpGet(ctx, admin+"/admin/v2/brokers/health")
			if err != nil {
				return err
			}
			if strings.TrimSpace(body) != "ok" {
				return fmt.Errorf("broker health: %q", body)
			}
			body, err = httpGet(ctx, admin+"/admin/v2/namespaces/public")
			if err != nil {
				return err
			}
			if !strings.Contains(body, `"public/default"`) {
				return fmt.Errorf("namespace public/default not created yet (%s)", strings.TrimSpace(body))
			}
			return nil
		}
		if err := p.waitReady(ctx, o.startTimeout(180*time.Second), ready); err != nil {
			p.stop()
			return nil, err
		}
		return &Server{
			Name:            Pulsar,
			Settings:        Settings{PulsarURL: fmt.Sprintf("pulsar://127.0.0.1:%d", brokerPort), PulsarAdminURL: admin},
			StartDuration:   time.Since(began),
			ResolveDuration: resolved,
			proc:            p,
		}, nil
	})
}
