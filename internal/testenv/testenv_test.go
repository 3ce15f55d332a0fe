package testenv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// fakeTB records how Require ended the test.
type fakeTB struct {
	testing.TB
	fatal, skip string
}

func (f *fakeTB) Helper()                        {}
func (f *fakeTB) Fatalf(format string, a ...any) { f.fatal = fmt.Sprintf(format, a...) }
func (f *fakeTB) Skipf(format string, a ...any)  { f.skip = fmt.Sprintf(format, a...) }

func TestRequire(t *testing.T) {
	for _, tc := range []struct {
		name            string
		env             map[string]string
		server          string
		want, fatal, sk string
	}{
		{name: "set", server: SQS, env: map[string]string{EnvSQSEndpoint: "http://127.0.0.1:1"}, want: "http://127.0.0.1:1"},
		{name: "set even in CI", server: Postgres, env: map[string]string{EnvCI: "true", EnvPostgresURL: "postgres://x"}, want: "postgres://x"},
		{name: "pulsar admin", server: PulsarAdmin, env: map[string]string{EnvPulsarAdminURL: "http://a"}, want: "http://a"},
		{name: "missing skips", server: Pulsar, sk: "./integration/test.sh"},
		{name: "missing in CI fails", server: Pulsar, env: map[string]string{EnvCI: "true"}, fatal: "pulsar server is required"},
		{name: "missing under launcher fails", server: PubSub, env: map[string]string{EnvTestEnv: "1"}, fatal: EnvPubSubEmulatorHost},
		{name: "CI=false skips", server: PubSub, env: map[string]string{EnvCI: "false"}, sk: "testenv up"},
		{name: "kafka", server: Kafka, env: map[string]string{EnvKafkaBrokers: "127.0.0.1:9092"}, want: "127.0.0.1:9092"},
		{name: "missing kafka in CI fails", server: Kafka, env: map[string]string{EnvCI: "true"}, fatal: EnvKafkaBrokers},
		{name: "unknown server", server: "rabbitmq", fatal: "unknown server"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range append([]string{EnvCI, EnvTestEnv}, SettingVars...) {
				t.Setenv(k, tc.env[k])
			}
			f := &fakeTB{}
			got := Require(f, tc.server)
			if got != tc.want {
				t.Errorf("Require = %q, want %q", got, tc.want)
			}
			check := func(what, got, want string) {
				if want == "" && got != "" {
					t.Errorf("unexpected %s: %s", what, got)
				}
				if want != "" && !strings.Contains(got, want) {
					t.Errorf("%s = %q, want it to contain %q", what, got, want)
				}
			}
			check("Fatalf", f.fatal, tc.fatal)
			check("Skipf", f.skip, tc.sk)
		})
	}
}

func TestParseServers(t *testing.T) {
	got, err := ParseServers("")
	if err != nil || strings.Join(got, ",") != "postgres,pubsub,sqs,pulsar,kafka,nats" {
		t.Fatalf("ParseServers(\"\") = %v, %v", got, err)
	}
	got, err = ParseServers(" pulsar, postgres,pulsar ")
	if err != nil || strings.Join(got, ",") != "pulsar,postgres" {
		t.Fatalf("ParseServers = %v, %v", got, err)
	}
	got, err = ParseServers("kafka")
	if err != nil || strings.Join(got, ",") != "kafka" {
		t.Fatalf("ParseServers(kafka) = %v, %v", got, err)
	}
	if _, err := ParseServers("postgres,rabbitmq"); err == nil {
		t.Fatal("ParseServers accepted rabbitmq")
	}
}

func TestSettingsEnviron(t *testing.T) {
	s := Settings{PostgresURL: "postgres://p", PulsarURL: "pulsar://q", KafkaBrokers: "127.0.0.1:1"}
	got := strings.Join(s.Environ(), " ")
	if got != EnvPostgresURL+"=postgres://p "+EnvPulsarURL+"=pulsar://q "+EnvKafkaBrokers+"=127.0.0.1:1" {
		t.Fatalf("Environ = %s", got)
	}
}

// TestParseMetadataTruncated feeds parseMetadata every prefix of a well-formed
// Metadata v4 response: each must fail with errShortMetadata (no panic, no
// made-up brokers), and the whole response must parse.
func TestParseMetadataTruncated(t *testing.T) {
	be := binary.BigEndian
	b := be.AppendUint32(nil, 7) // correlation id
	b = be.AppendUint32(b, 0)    // throttle
	b = be.AppendUint32(b, 1)    // one broker
	b = be.AppendUint32(b, 1)    // node id
	b = appendKafkaString(b, "127.0.0.1")
	b = be.AppendUint32(b, 9092)
	b = be.AppendUint16(b, 0xffff) // rack: null
	b = appendKafkaString(b, "cluster")
	b = be.AppendUint32(b, 1)     // controller id
	b = be.AppendUint32(b, 1)     // one topic
	b = be.AppendUint16(b, 0)     // error code
	b = appendKafkaString(b, "t") // name
	b = append(b, 0)              // is_internal
	b = be.AppendUint32(b, 2)     // two partitions
	for p, leader := range []int32{1, -1} {
		b = be.AppendUint16(b, 0)
		b = be.AppendUint32(b, uint32(p))
		b = be.AppendUint32(b, uint32(leader))
		b = be.AppendUint32(b, 1) // replicas
		b = be.AppendUint32(b, 1)
		b = be.AppendUint32(b, 0) // isr: empty
	}
	md, err := parseMetadata(b, 7)
	if err != nil {
		t.Fatalf("parseMetadata: %v", err)
	}
	want := kafkaTopicMetadata{Name: "t", Partitions: 2, Leaders: 1}
	if len(md.Brokers) != 1 || md.Brokers[0] != "127.0.0.1:9092" || len(md.Topics) != 1 || md.Topics[0] != want {
		t.Fatalf("parseMetadata = %+v", md)
	}
	if _, err := parseMetadata(b, 8); err == nil || !strings.Contains(err.Error(), "correlation id") {
		t.Errorf("wrong correlation id: err = %v", err)
	}
	for n := range len(b) {
		if md, err := parseMetadata(b[:n], 7); !errors.Is(err, errShortMetadata) {
			t.Errorf("%d of %d bytes: parseMetadata = %+v, %v; want errShortMetadata", n, len(b), md, err)
		}
	}
}
