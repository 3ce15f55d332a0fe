package otelkeyorder_test

import (
	"testing"

	"github.com/keyorder/keyorder/otelkeyorder"
)

func TestFromURL(t *testing.T) {
	for _, c := range []struct{ url, system, name string }{
		{"mem://ledger", "memory", "ledger"},
		{"mem://ledger?subscription=apply", "memory", "apply"},
		{"postgres://u:secret@db:5432/app?topic=ledger", "postgresql", "ledger"},
		{"postgres://u:secret@db:5432/app?topic=ledger&subscription=apply", "postgresql", "apply"},
		{"pubsub://proj/ledger", "gcp_pubsub", "proj/ledger"},
		{"sqs://ledger.fifo?endpoint=http://localhost:9324", "aws_sqs", "ledger.fifo"},
		{"pulsar://broker:6650/public/default/ledger", "pulsar", "public/default/ledger"},
		{"pulsar+ssl://broker:6651/public/default/ledger?subscription=apply", "pulsar", "apply"},
		{"kafka://b1:9092,b2:9092/ledger", "kafka", "ledger"},
		{"kafka://b1:9092/ledger?group=apply&ordering=ordered", "kafka", "apply"},
		{"nats://n1:4222/LEDGER", "nats", "LEDGER"},
		{"nats://n1:4222/LEDGER?subscription=apply&ordering=ordered", "nats", "apply"},
	} {
		if system, name := otelkeyorder.FromURL(c.url); system != c.system || name != c.name {
			t.Errorf("FromURL(%q) = %q, %q; want %q, %q", c.url, system, name, c.system, c.name)
		}
	}
}
