// Package testenv gives keyorder's tests real servers: PostgreSQL 15, Google's
// Pub/Sub emulator, ElasticMQ (SQS FIFO), an Apache Pulsar standalone broker,
// an Apache Kafka broker in KRaft mode and a NATS server with JetStream.
//
// Tests call Require to get a server's connection setting. The settings come from
// environment variables, which the launcher (integration/cmd/testenv) exports
// after starting the servers:
//
//	./integration/test.sh                    # all servers, go test ./...
//	go run ./integration/cmd/testenv up      # servers in the foreground; then
//	. .testenv/env; go test ./adapters/postgres/...
//
// The same package holds the Start functions the launcher uses; they start each
// server as a child process on 127.0.0.1, on free ports, with its data in a
// temporary directory, wait for a real readiness signal, and stop it again.
package testenv

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// Environment variables that carry the connection settings to tests.
const (
	// EnvPostgresURL is a postgres:// URL, e.g.
	// postgres://postgres@127.0.0.1:5432/keyorder?sslmode=disable.
	EnvPostgresURL = "KEYORDER_PG_URL"
	// EnvPubSubEmulatorHost is host:port of the Pub/Sub emulator; Google's
	// client libraries read it themselves.
	EnvPubSubEmulatorHost = "PUBSUB_EMULATOR_HOST"
	// EnvSQSEndpoint is the http:// base endpoint of the SQS-compatible server.
	EnvSQSEndpoint = "KEYORDER_SQS_ENDPOINT"
	// EnvPulsarURL is the pulsar:// service URL of the broker.
	EnvPulsarURL = "KEYORDER_PULSAR_URL"
	// EnvPulsarAdminURL is the http:// URL of the broker's admin (web) service.
	EnvPulsarAdminURL = "KEYORDER_PULSAR_ADMIN_URL"
	// EnvKafkaBrokers is the comma-separated host:port list of the Kafka
	// brokers (bootstrap servers); the launcher starts one, e.g. 127.0.0.1:9092.
	EnvKafkaBrokers = "KEYORDER_KAFKA_BROKERS"
	// EnvNATSURL is the nats:// URL of the NATS server (JetStream enabled).
	EnvNATSURL = "KEYORDER_NATS_URL"

	// EnvTestEnv is set to 1 by the launcher when it started every server, so a
	// test that finds its server's variable missing fails instead of skipping.
	EnvTestEnv = "KEYORDER_TESTENV"
	// EnvCI is set to "true" by CI; there, too, a missing server is a failure.
	EnvCI = "CI"
)

// SettingVars lists the environment variables that carry settings.
var SettingVars = []string{EnvPostgresURL, EnvPubSubEmulatorHost, EnvSQSEndpoint, EnvPulsarURL, EnvPulsarAdminURL, EnvKafkaBrokers, EnvNATSURL}

// Server names accepted by Require and by the launcher's --only flag.
const (
	Postgres    = "postgres"
	PubSub      = "pubsub"
	SQS         = "sqs"
	Pulsar      = "pulsar"
	PulsarAdmin = "pulsar-admin" // Require only: the admin URL of the Pulsar server
	Kafka       = "kafka"
	NATS        = "nats"
)

// AllServers lists the servers the launcher starts by default.
var AllServers = []string{Postgres, PubSub, SQS, Pulsar, Kafka, NATS}

// Settings are the connection settings of the running servers. An empty field
// means that server is not running.
type Settings struct {
	PostgresURL        string // KEYORDER_PG_URL
	PubSubEmulatorHost string // PUBSUB_EMULATOR_HOST
	SQSEndpoint        string // KEYORDER_SQS_ENDPOINT
	PulsarURL          string // KEYORDER_PULSAR_URL
	PulsarAdminURL     string // KEYORDER_PULSAR_ADMIN_URL
	KafkaBrokers       string // KEYORDER_KAFKA_BROKERS
	NATSURL            string // KEYORDER_NATS_URL
}

// FromEnv reads the settings from the environment.
func FromEnv() Settings {
	return Settings{
		PostgresURL:        os.Getenv(EnvPostgresURL),
		PubSubEmulatorHost: os.Getenv(EnvPubSubEmulatorHost),
		SQSEndpoint:        os.Getenv(EnvSQSEndpoint),
		PulsarURL:          os.Getenv(EnvPulsarURL),
		PulsarAdminURL:     os.Getenv(EnvPulsarAdminURL),
		KafkaBrokers:       os.Getenv(EnvKafkaBrokers),
		NATSURL:            os.Getenv(EnvNATSURL),
	}
}

// Vars returns the non-empty settings as environment variable name/value pairs,
// in a fixed order.
func (s Settings) Vars() [][2]string {
	var out [][2]string
	add := func(k, v string) {
		if v != "" {
			out = append(out, [2]string{k, v})
		}
	}
	add(EnvPostgresURL, s.PostgresURL)
	add(EnvPubSubEmulatorHost, s.PubSubEmulatorHost)
	add(EnvSQSEndpoint, s.SQSEndpoint)
	add(EnvPulsarURL, s.PulsarURL)
	add(EnvPulsarAdminURL, s.PulsarAdminURL)
	add(EnvKafkaBrokers, s.KafkaBrokers)
	add(EnvNATSURL, s.NATSURL)
	return out
}

// Environ returns the settings as "NAME=value" strings for os/exec.
func (s Settings) Environ() []string {
	var out []string
	for _, kv := range s.Vars() {
		out = append(out, kv[0]+"="+kv[1])
	}
	return out
}

// envVar maps a server name to the variable Require reads.
func envVar(server string) (string, bool) {
	switch server {
	case Postgres:
		return EnvPostgresURL, true
	case PubSub:
		return EnvPubSubEmulatorHost, true
	case SQS:
		return EnvSQSEndpoint, true
	case Pulsar:
		return EnvPulsarURL, true
	case PulsarAdmin:
		return EnvPulsarAdminURL, true
	case Kafka:
		return EnvKafkaBrokers, true
	case NATS:
		return EnvNATSURL, true
	}
	return "", false
}

// Require returns the connection setting of server ("postgres", "pubsub",
// "sqs", "pulsar", "pulsar-admin" for Pulsar's admin URL, "kafka" for the
// Kafka bootstrap servers, or "nats") from its environment variable.
//
// When the variable is not set, the test is skipped with a message that says
// how to run it with servers, unless CI=true or KEYORDER_TESTENV=1 (set by the
// launcher): then a missing server is a failure (t.Fatalf).
func Require(t testing.TB, server string) string {
	t.Helper()
	name, ok := envVar(server)
	if !ok {
		t.Fatalf("testenv.Require: unknown server %q (want one of %s, %s, %s, %s, %s, %s, %s)",
			server, Postgres, PubSub, SQS, Pulsar, PulsarAdmin, Kafka, NATS)
		return ""
	}
	if v := os.Getenv(name); v != "" {
		return v
	}
	if mustHaveServers() {
		t.Fatalf("testenv: the %s server is required but %s is not set (%s); "+
			"the test launcher did not start it or did not export its settings",
			server, name, strings.TrimSpace(why()))
		return ""
	}
	t.Skipf("testenv: skipping, needs a real %s server: %s is not set. "+
		"Run the tests with servers via ./integration/test.sh "+
		"(or: go run ./integration/cmd/testenv run -- go test ./...), or start them once with "+
		"`go run ./integration/cmd/testenv up` and then `. .testenv/env` in this shell",
		server, name)
	return ""
}

func mustHaveServers() bool {
	return os.Getenv(EnvCI) == "true" || os.Getenv(EnvTestEnv) == "1"
}

func why() string {
	var s []string
	if os.Getenv(EnvCI) == "true" {
		s = append(s, "CI=true")
	}
	if os.Getenv(EnvTestEnv) == "1" {
		s = append(s, EnvTestEnv+"=1")
	}
	return fmt.Sprint(strings.Join(s, ", "))
}
