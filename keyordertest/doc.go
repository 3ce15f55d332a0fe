// Package keyordertest proves, in your own tests, that your pipeline keeps
// keyorder's per-key guarantee.
//
// The library's conformance suite proves that each backend keeps the
// guarantee. It cannot prove that your application does: a middleware that
// hands work to a goroutine, a handler that swallows its context, a
// subscription created Exclusive where the ledger needs Ordered, a retry
// wrapper of your own — each of these breaks per-key order while every
// message still gets handled, and an ordinary test that counts results
// stays green. This package records what actually happened and checks it
// against the rules, so such a change fails a test with an explanation
// instead of corrupting balances in production.
//
// # Recording
//
// A Recorder's Middleware wraps your handler (put it first in
// subscribe.Config.Middleware, or inside your own middleware to check what
// they do) and stamps every handling: key, message ID, a label, attempt,
// start, end and outcome (Ack, Retry, Panic, DeadPermanent, DeadBudget, or
// Abandoned when the handler's context was cancelled). Tell it what you
// published, in order, with Published. One Recorder may wrap the handlers
// of several consumers.
//
// # Checking
//
// Verify (or Check, which calls t.Error) checks the history against a
// Spec: under every policy, each published message was acknowledged or
// dead-lettered; under Exclusive and Ordered, no two handlings of a key
// overlapped; under Ordered, a key's messages were first handled in
// publish order and none started while an earlier one of its key was
// unresolved. Handlings after a message was resolved are duplicates —
// allowed, as delivery is at least once, and counted in the Report (or
// forbidden with Spec.ForbidDuplicates). The first violation, in the order
// things happened, is explained in words: which key, which messages, what
// happened when. Overlap is decided by the order in which the recorder saw
// starts and ends, not by clock readings, so it is exact under
// testing/synctest's fake clock too.
//
// # Fault injection
//
// On the in-memory backend (adapters/memory), FailHandler makes chosen
// handlings fail or panic (by key, message ID, payload, attempt),
// FailPublishes makes chosen sends fail (by key or call number),
// FailSettlements makes chosen acknowledgements, nacks, releases, dead
// letters and lease extensions fail (by operation, key or call number;
// before or after taking effect), and StartConsumer runs a subscriber whose Crash loses the consumer — its
// leases expire without settlement, as a dead process's do — and whose
// Restart starts its replacement. Run them inside testing/synctest and the
// retries, lease expiries and backoffs take no real time.
//
// The same Recorder and checker run in keyorder's own conformance suite
// against every backend (the in-memory one, PostgreSQL, Pub/Sub, SQS,
// Pulsar, Kafka and NATS), so what they accept is what real brokers do.
package keyordertest
