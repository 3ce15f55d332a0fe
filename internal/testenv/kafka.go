package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// kafkaJVMFlags are the JVM options of the broker: a small heap and the serial
// collector, since the machine has 2 cores and the other servers run beside it.
var kafkaJVMFlags = []string{
	"-Xms128m", "-Xmx1g",
	"-XX:+UseSerialGC",
	"-XX:-UsePerfData", // no /tmp/hsperfdata files
	"-Djava.awt.headless=true",
}

// kafkaConf is the broker configuration; kafkaConfig appends the listeners,
// the controller quorum and the log directory. Replication factors are
// 1 (one broker), the internal topics have few partitions so that the first
// consumer group or transaction does not wait for 50 partitions to be created,
// and thread pools are small for 2 cores.
const kafkaConf = `# Written by internal/testenv: one combined broker+controller, KRaft mode.
process.roles=broker,controller
node.id=1
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
auto.create.topics.enable=true
delete.topic.enable=true
num.partitions=4
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
background.threads=4
`

// StartKafka starts an Apache Kafka broker in KRaft mode (no ZooKeeper): one
// process that is both broker and controller (org.apache.kafka:kafka_2.13,
// resolved with Maven from integration/java/kafka/pom.xml), data in
// o.Dir/kafka. The client (PLAINTEXT) and controller listeners are free ports on
// 127.0.0.1; the controller quorum is static (controller.quorum.voters), this
// node its only voter.
//
// A KRaft log directory must be formatted before the first start. Kafka's own
// tool does that (kafka.tools.StorageTool format, what `kafka-storage.sh format`
// runs), but it is a JVM start of its own (1-4 s on the loaded 2-core machine).
// With a static quorum the formatted directory holds nothing that depends on
// the ports or the path (meta.properties: cluster, node and directory ids;
// bootstrap.checkpoint: the feature levels), so it is formatted once into
// integration/java/target/kafka-storage (again when the jars or the broker
// configuration change) and copied for each start.
//
// Readiness is a Metadata request sent over TCP by hand (metadataBrokers): the
// broker answers only once it processes requests, and lists itself only once
// the controller has registered and unfenced it, which is when topics can be
// created and written. This needs no Kafka client in this module (whose go.mod
// stays free of heavy dependencies) and no second JVM.
//
// Measured on the 2-core machine (2026-12-03, Kafka 4.3.2, Java 17), see
// integration/README.md: the first run with an empty Maven cache resolves the
// jars (56 MB downloaded, 44 MB copied) in about 17 s; warm, the broker is ready
// about 4 s after launch on a quiet machine, 10-16 s alone at load average
// 7-16 and 62 s with all five servers starting at load average 19 (hence the
// 180 s default timeout); stopping takes about 1 s.
func StartKafka(ctx context.Context, o Options) (*Server, error) {
	java, cp, resolved, err := javaClasspath(ctx, &o, Kafka)
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	src := filepath.Join(o.RepoRoot, javaDir, Kafka)
	logConf := "-Dlog4j2.configurationFile=" + filepath.Join(src, "log4j2.xml")
	return startWithRetry(ctx, &o, Kafka, 3, func(attempt int) (*Server, error) {
		dir := filepath.Join(o.Dir, Kafka, strconv.Itoa(attempt))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		data := filepath.Join(dir, "data")
		if err := copyKafkaStorage(ctx, &o, java, cp, logConf, data); err != nil {
			return nil, err
		}
		ports, err := freePorts(2)
		if err != nil {
			return nil, err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
		conf := filepath.Join(dir, "server.properties")
		if err := os.WriteFile(conf, []byte(kafkaConfig(addr, ports[1], data)), 0o644); err != nil {
			return nil, err
		}
		began := time.Now()
		args := append(append([]string(nil), kafkaJVMFlags...), logConf, "-cp", cp, "kafka.Kafka", conf)
		cmd := exec.Command(java, args...)
		cmd.Dir = dir
		p, err := startProc(Kafka, cmd, filepath.Join(dir, "kafka.log"), syscall.SIGTERM, 30*time.Second)
		if err != nil {
			return nil, err
		}
		ready := func(ctx context.Context) error {
			brokers, err := metadataBrokers(ctx, addr)
			if err != nil {
				return err
			}
			for _, b := range brokers {
				if b == addr {
					return nil
				}
			}
			return fmt.Errorf("broker not registered yet (metadata lists %v)", brokers)
		}
		if err := p.waitReady(ctx, o.startTimeout(180*time.Second), ready); err != nil {
			p.stop()
			return nil, err
		}
		return &Server{
			Name:            Kafka,
			Settings:        Settings{KafkaBrokers: addr},
			StartDuration:   time.Since(began),
			ResolveDuration: resolved,
			proc:            p,
		}, nil
	})
}

// kafkaConfig returns the server.properties of a broker whose client listener
// is addr (127.0.0.1:port), controller listener 127.0.0.1:controllerPort and
// log directory logDir.
func kafkaConfig(addr string, controllerPort int, logDir string) string {
	return kafkaConf + fmt.Sprintf("listeners=PLAINTEXT://%s,CONTROLLER://127.0.0.1:%d\n"+
		"advertised.listeners=PLAINTEXT://%s\n"+
		"controller.quorum.voters=1@127.0.0.1:%d\n"+
		"log.dirs=%s\n",
		addr, controllerPort, addr, controllerPort, logDir)
}

// copyKafkaStorage copies integration/java/target/kafka-storage, a log
// directory formatted by kafka.tools.StorageTool for the broker configuration,
// to dst, formatting it first if it is missing or was made for other jars or
// another configuration (a stamp file holds what it was made for). Concurrent
// launchers are serialised with a lock file.
func copyKafkaStorage(ctx context.Context, o *Options, java, cp, logConf, dst string) error {
	unlock, err := lockFile(ctx, filepath.Join(o.RepoRoot, javaDir, "target", "kafka-storage.lock"))
	if err != nil {
		return err
	}
	defer unlock()
	tmpl, err := kafkaStorageTemplate(ctx, o, java, cp, logConf)
	if err != nil {
		return err
	}
	if err := os.CopyFS(dst, os.DirFS(tmpl)); err != nil {
		return fmt.Errorf("kafka: copy the formatted storage: %w", err)
	}
	return nil
}

// kafkaStorageTemplate returns the formatted template directory, making it
// first if needed. The caller holds the lock.
func kafkaStorageTemplate(ctx context.Context, o *Options, java, cp, logConf string) (string, error) {
	target := filepath.Join(o.RepoRoot, javaDir, "target")
	tmpl := filepath.Join(target, "kafka-storage")
	stampPath := tmpl + ".stamp"
	// Missing only while another launcher re-resolves the jars: then the
	// template is made again next time.
	lib, _ := os.ReadFile(filepath.Join(target, Kafka+"-lib.stamp"))
	stamp := fmt.Sprintf("%s\n%s", lib, kafkaConf)
	if b, err := os.ReadFile(stampPath); err == nil && string(b) == stamp {
		if _, err := os.Stat(filepath.Join(tmpl, "meta.properties")); err == nil {
			return tmpl, nil
		}
	}
	began := time.Now()
	tmp := tmpl + ".tmp"
	_ = os.RemoveAll(tmp)
	_ = os.Remove(stampPath)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", err
	}
	conf := filepath.Join(tmp, "server.properties")
	// The ports are never bound: formatting only reads the configuration.
	if err := os.WriteFile(conf, []byte(kafkaConfig("127.0.0.1:9092", 9093, filepath.Join(tmp, "data"))), 0o644); err != nil {
		return "", err
	}
	fctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(fctx, java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData", logConf,
		"-cp", cp, "kafka.tools.StorageTool", "format", "--config", conf, "--cluster-id", newKafkaClusterID())
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("kafka: format the storage (kafka.tools.StorageTool): %w\n%s", err, lastLines(string(out), 40))
	}
	_ = os.RemoveAll(tmpl)
	if err := os.Rename(filepath.Join(tmp, "data"), tmpl); err != nil {
		return "", err
	}
	_ = os.RemoveAll(tmp)
	if err := os.WriteFile(stampPath, []byte(stamp), 0o644); err != nil {
		return "", err
	}
	o.logf("kafka: formatted the storage template %s in %.1fs", tmpl, time.Since(began).Seconds())
	return tmpl, nil
}

// newKafkaClusterID returns a random cluster id in Kafka's form (a 16-byte UUID
// in unpadded URL-safe base64), not starting with '-' so that no command line
// parser takes it for an option (Kafka's Uuid.randomUuid avoids that, too).
func newKafkaClusterID() string {
	for {
		var b [16]byte
		_, _ = rand.Read(b[:])
		if id := base64.RawURLEncoding.EncodeToString(b[:]); id[0] != '-' {
			return id
		}
	}
}

// Kafka protocol constants of the one request the readiness check sends.
const (
	kafkaMetadataKey = 3
	// Version 4 is the oldest Metadata version Kafka 4 still accepts (KIP-896
	// removed 0-3) and the last before the flexible (tagged-field) encoding.
	kafkaMetadataVersion = 4
	kafkaClientID        = "keyorder-testenv"
)

// kafkaMetadata is the part of a Metadata response the launcher and its tests read.
type kafkaMetadata struct {
	Brokers []string // host:port of each broker listed
	Topics  []kafkaTopicMetadata
}

type kafkaTopicMetadata struct {
	Name       string
	ErrorCode  int16 // 0: none; e.g. 5 LEADER_NOT_AVAILABLE while being created
	Partitions int
	Leaders    int // partitions that have a leader
}

// metadataBrokers returns the brokers a Metadata request to addr lists. A
// KRaft broker lists only brokers the controller has registered and unfenced.
func metadataBrokers(ctx context.Context, addr string) ([]string, error) {
	md, err := requestMetadata(ctx, addr, nil, false)
	if err != nil {
		return nil, err
	}
	return md.Brokers, nil
}

// requestMetadata sends one Metadata request (v4) for topics (none if empty)
// to addr over a new connection and reads the response. autoCreate asks the
// broker to create missing topics (if auto.create.topics.enable is on).
func requestMetadata(ctx context.Context, addr string, topics []string, autoCreate bool) (*kafkaMetadata, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	const correlationID = 1
	req := binary.BigEndian.AppendUint32(nil, 0) // size, set below
	req = binary.BigEndian.AppendUint16(req, kafkaMetadataKey)
	req = binary.BigEndian.AppendUint16(req, kafkaMetadataVersion)
	req = binary.BigEndian.AppendUint32(req, correlationID)
	req = appendKafkaString(req, kafkaClientID)
	req = binary.BigEndian.AppendUint32(req, uint32(len(topics))) // empty array: no topics
	for _, t := range topics {
		req = appendKafkaString(req, t)
	}
	if autoCreate {
		req = append(req, 1)
	} else {
		req = append(req, 0)
	}
	binary.BigEndian.PutUint32(req, uint32(len(req)-4))
	if _, err := c.Write(req); err != nil {
		return nil, fmt.Errorf("kafka metadata request: %w", err)
	}
	var size int32
	if err := binary.Read(c, binary.BigEndian, &size); err != nil {
		return nil, fmt.Errorf("kafka metadata response: %w", err)
	}
	if size < 4 || size > 1<<20 {
		return nil, fmt.Errorf("kafka metadata response: size %d", size)
	}
	resp := make([]byte, size)
	if _, err := io.ReadFull(c, resp); err != nil {
		return nil, fmt.Errorf("kafka metadata response: %w", err)
	}
	return parseMetadata(resp, correlationID)
}

func appendKafkaString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

var errShortMetadata = errors.New("kafka metadata response: truncated")

// parseMetadata reads a Metadata v4 response (header v0 included, size prefix
// not).
func parseMetadata(b []byte, correlationID int32) (*kafkaMetadata, error) {
	r := bytes.NewReader(b)
	fail := false
	i32 := func() int32 {
		var v int32
		if binary.Read(r, binary.BigEndian, &v) != nil {
			fail = true
		}
		return v
	}
	i16 := func() int16 {
		var v int16
		if binary.Read(r, binary.BigEndian, &v) != nil {
			fail = true
		}
		return v
	}
	str := func() string {
		l := i16()
		if fail || l < 0 { // null
			return ""
		}
		s := make([]byte, l)
		if _, err := io.ReadFull(r, s); err != nil {
			fail = true
		}
		return string(s)
	}
	// count reads an array length; each element takes at least min bytes.
	count := func(min int) int {
		n := i32()
		if fail || n < 0 {
			return 0
		}
		if int64(n)*int64(min) > int64(r.Len()) {
			fail = true
			return 0
		}
		return int(n)
	}
	if corr := i32(); !fail && corr != correlationID {
		return nil, fmt.Errorf("kafka metadata response: correlation id %d, want %d", corr, correlationID)
	}
	i32() // throttle_time_ms
	md := &kafkaMetadata{}
	for range count(12) {
		i32() // node_id
		host := str()
		port := i32()
		str() // rack
		if fail {
			return nil, errShortMetadata
		}
		md.Brokers = append(md.Brokers, net.JoinHostPort(host, strconv.Itoa(int(port))))
	}
	str() // cluster_id
	i32() // controller_id
	for range count(9) {
		t := kafkaTopicMetadata{ErrorCode: i16(), Name: str()}
		if _, err := r.ReadByte(); err != nil { // is_internal
			fail = true
		}
		for range count(18) {
			i16() // error_code
			i32() // partition_index
			if i32() >= 0 {
				t.Leaders++
			}
			for range count(4) { // replica_nodes
				i32()
			}
			for range count(4) { // isr_nodes
				i32()
			}
			t.Partitions++
		}
		if fail {
			return nil, errShortMetadata
		}
		md.Topics = append(md.Topics, t)
	}
	if fail {
		return nil, errShortMetadata
	}
	return md, nil
}
