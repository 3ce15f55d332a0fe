// Package model is a model broker for testing: an in-memory subscription
// whose driver does everything the driver contract (package driver) permits
// a real broker to do, each behaviour drawn from a seeded random source.
//
// The memory backend (adapters/memory) behaves like one well-mannered
// broker. Real brokers are allowed much more: Pub/Sub keeps a deadline per
// delivery and may report one message's lease lost while a later message of
// its key is still leased; a call may fail after it took effect, or time
// out; an acknowledged message may come back; a Kafka partition moves to
// another process while this one still holds its records; a process crashes
// holding leases and another takes over. Code that consumes through the
// driver contract (keyorder's subscribe package, or a consumer of your own)
// keeps its promise only if it copes with all of it. A model Broker lets a
// test draw such histories at random, seed by seed, under testing/synctest,
// and check the promise after each.
//
// A Broker is one subscription on one topic. Topic returns its publishing
// driver; NewInstance returns the driver of one consumer process (call it
// again for the next process, or for several processes at once). The
// capabilities it declares (NativeHold, HoldChains, chains, MixedKeySender,
// and the optional StartRecorder, Returner and Revocable interfaces) are set
// in Config, so one test can run every combination. Faults sets how often
// each fault happens; zero Faults is a broker that never misbehaves.
// Instance.Crash loses a process as a crash does (its leases run out unsettled),
// and Broker.Revoke takes a range of keys from one instance as a rebalance
// does.
//
// The broker keeps its own record of what happened (Broker.Acked,
// Broker.DeadLetters, Broker.LostLeases, Broker.UnseenCharges) so that a test can check a
// consumer against the broker's truth rather than against what the consumer
// believes. Started and Return never fail: the attempt counts they carry
// are exact, so a test may require that attempts equal runs wherever the
// capabilities promise it.
//
// To test a driver of your own, run the same property test over both: a
// consumer that passes over the model but fails over your driver points at
// your driver, and a history the model cannot produce points at a gap in the
// model worth reporting.
package model
