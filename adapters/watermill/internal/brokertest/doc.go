// Package brokertest runs Watermill's universal Pub/Sub test suite
// (github.com/ThreeDotsLabs/watermill/pubsub/tests) over the Watermill mount
// on every keyorder backend: memory, PostgreSQL, Pub/Sub, SQS FIFO, Pulsar,
// Kafka and NATS, each against a real server started by integration/cmd/testenv.
//
// It is a module of its own so that the mount's module
// (github.com/keyorder/keyorder/adapters/watermill) requires only keyorder
// and Watermill: running the suite on every backend needs all four broker
// SDKs, and a Watermill user should not download them to use one. The
// package holds only tests; it is internal because nothing should import it.
package brokertest
