// Package subscribe is the portable consuming API of keyorder.
//
// A Subscriber wraps a backend's adapters.Subscription driver and runs a
// handler on keyed worker lanes (package lanes), so one key keeps its order
// inside the process as it does on the broker. It owns everything that must
// behave the same on every broker: what a handler's result means, retries
// with backoff, the attempt budget, dead letters, keeping leases alive while
// a message is held or handled, suppressing redeliveries of messages this
// process already acknowledged, and graceful shutdown.
//
// A subscription receives what is published after it exists; nothing
// published before is promised to it (SQS and Pulsar may deliver some; do
// not rely on it). Open the Subscriber (on backends that create the
// subscription on open: mem://, Pub/Sub, Pulsar, PostgreSQL with
// create=true) or create the subscription before the first publish; see the
// package's examples.
//
// # Ordering
//
// The subscription's policy (Capabilities.Ordering) is enforced twice: by
// the broker, and by the lanes in process. Where the broker holds a group
// natively (Capabilities.NativeHold) a failed message is returned with Nack
// and the broker holds its group; the rest of a chain received with it is
// returned unhandled. Elsewhere the failed message stays in its lane, its
// key parked until the retry time, its lease kept alive, and it is retried
// in process before anything behind it; the broker is never asked to
// redeliver it.
//
// # Delivery semantics
//
// The handler's result decides: nil acknowledges; an error retries with
// backoff (Config.Retry); keyorder.RetryAfter(err, d) retries not before d;
// keyorder.Permanent(err) dead-letters at once, as does running out of
// attempts. A panic is recovered and counts as a failed attempt. The
// handler's context is cancelled when the message's lease is lost or the
// subscriber shuts down past its deadline. Delivery is at least once;
// messages whose ID this process acknowledged recently are acknowledged
// again without running the handler.
//
// Attempts are counted per message from the broker's delivery count
// (adapters.Message.Attempt) plus, where the process holds groups, the
// retries run in process. A broker without native hold never hears of
// those retries, so a process that dies takes them with it: the
// redelivery's count restarts from the broker's, and across a crash a
// message can run more than MaxAttempts times in total (on Pub/Sub the
// subscription's max delivery attempts bounds the deliveries; see the
// pubsub package). Where the broker holds groups (PostgreSQL, SQS) every
// retry goes through the broker and the count survives a crash.
//
// # Settlement under a flaky network
//
// Settling a message (Ack, Nack, Release, DeadLetter) and renewing leases
// (ExtendLeases) are retried with backoff while the driver reports the error
// retryable (adapters.Subscription.IsRetryable), a bounded number of times
// within a bounded time; drivers never retry on their own. A Nack, Release
// or DeadLetter is retried on the message's lane, so under Ordered the key
// moves on only after the broker has the settlement; acknowledgements are
// retried beside the batching acker, so one failing batch does not hold the
// others. A settlement given up (a permanent error, or retries exhausted) is
// logged and counted in Stats.SettleFailures and the message is left to the
// broker, which redelivers it when its lease expires; a redelivered message
// whose handler already succeeded is acknowledged without running again,
// and one this process dead-lettered is dead-lettered again (with its
// reason and attempts), also without running.
package subscribe
