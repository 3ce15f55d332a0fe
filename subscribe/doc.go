// Package subscribe is the portable consuming API of keyorder.
//
// A Subscriber wraps a backend's driver (see New) and runs a
// handler on keyed worker lanes (package lanes), so one key keeps its order
// inside the process as it does on the broker. It owns everything that must
// behave the same on every broker: what a handler's result means, retries
// with backoff, the attempt budget, dead letters, keeping leases alive while
// a message is held or handled, suppressing redeliveries of messages this
// process already acknowledged, and graceful shutdown.
//
// A subscription receives what is published after it exists; nothing
// published before is promised to it (SQS and Pulsar may deliver some; do
// not rely on it; a new Kafka group starts at the topic's oldest record).
// Open the Subscriber (on backends that create the subscription on open:
// mem://, Pub/Sub, Pulsar, PostgreSQL with create=true) or create the
// subscription before the first publish; see the package's examples.
//
// # Ordering
//
// The subscription's policy (Capabilities.Ordering) is enforced twice: by
// the broker, and by the lanes in process. Where the broker holds a group
// natively (Capabilities.NativeHold) a failed message is returned with Nack
// and the broker holds its group; the rest of a chain received with it is
// returned unhandled, unless the driver declares Capabilities.HoldChains
// (SQS, whose receive count would count that return as an attempt in the
// next process): then a failed member of a chain is held in process as
// below, the chain's rest waiting behind it, and only a failed message
// received alone is returned with Nack. Elsewhere the failed message stays in its lane, its
// key parked until the retry time, its lease kept alive, and it is retried
// in process before anything behind it; the broker is never asked to
// redeliver it.
//
// # Held keys
//
// Where the process holds groups (no native hold: Pub/Sub, Pulsar, Kafka, a
// memory subscription with Hold InProcess) the broker goes on streaming a
// held key's later messages: those brokers hand over a key's messages
// whether or not its earlier ones are settled. They wait in process
// behind the key's head, in its lane, their leases kept alive, and hold
// no flow-control token (Config.MaxOutstanding), so the other keys go on
// being received and run. Config.MaxHeld limits them, together with every other message
// waiting in process on a time (a retry, a not-before time, a throttle):
// the subscriber receives only while fewer than MaxHeld messages are held,
// so it never keeps more than MaxOutstanding+MaxHeld received messages,
// and its lanes have room for all of them, so a key's backlog never
// blocks the receive loop in a full lane.
//
// When MaxHeld messages are held, receiving pauses, for every key (a
// receive cannot choose its keys), until held messages have run: for a
// held key's backlog, once its head's time has come and the head is
// settled; the pause is logged. Pausing is the one bound that is correct
// on every such broker. Handing the newest of a held key's messages back
// would not be: Pub/Sub counts every nack as a delivery attempt (towards
// the subscription's dead-letter policy) of a message that never ran and
// redelivers it at once, Google's emulator queues it behind the key's
// later messages (out of order), Pulsar redelivers it only when the
// consumer closes (a nack there replays out of order), and the memory
// broker hands it straight back, ahead of other keys. For a held key never
// to stop the others, set MaxHeld above the backlog a key can gather while
// it is held (its publish rate times the longest retry delay).
//
// Where the broker holds groups natively (PostgreSQL, SQS, a memory
// subscription with Hold Native) a held key's later messages stay on the
// broker, and only messages waiting in process on a time (a throttled
// message, say) count against MaxHeld; under Capabilities.HoldChains (SQS)
// so do the members of a held chain waiting behind its failed message (at
// most one receive's worth of a key).
//
// # Keys, fairness and throttling
//
// Config.LaneKey refines the broker's groups in process (never merges
// them: the broker, not this process, orders across its groups).
// Config.FairnessKey names a message's tenant (FairnessKeyHeader reads the
// portable keyorder.HeaderFairnessKey header); with it the lanes serve
// tenants round robin among the messages this process holds, group order
// first (see package lanes). Fairness cannot reach messages the broker has
// not handed over yet: flow control (MaxOutstanding, and MaxHeld for what
// waits) bounds what it can reorder, so a tenant's backlog larger than that window
// still delays the others in the broker's own order.
//
// Config.Throttles are token buckets checked just before each handler call.
// A message whose bucket is empty waits at the head of its group in its
// lane (its group held under Ordered and Exclusive, since it has not
// failed; nothing held under Parallel; its flow-control token given back,
// its lease kept alive), but
// its wait is not an attempt and, on brokers that hold groups natively, it
// is not handed back: it stays in process until its bucket has a token.
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
// (as the driver reports it) plus, where the process holds groups, the
// retries run in process. A broker without native hold never hears of
// those retries, so a process that dies takes them with it: the
// redelivery's count restarts from the broker's, and across a crash a
// message can run more than MaxAttempts times in total (on Pub/Sub the
// subscription's max delivery attempts bounds the deliveries; see the
// pubsub package). Where the broker holds groups (PostgreSQL, SQS) every
// retry goes through the broker and the count survives a crash.
//
// # Batches
//
// A hot key is serial under Exclusive and Ordered. RunBatch lifts that
// ceiling without giving up order: its handler (BatchHandlerFunc) gets up to
// Config.Batch.MaxSize consecutive messages of one key, in order, and at
// most one batch per key is in flight (under Parallel with lanes.Shared
// several batches of a key may run at once; lanes.ByKey keeps a key on one
// lane). A batch that is not full is handed over
// Config.Batch.MaxWait after its first message arrived. Keyless messages
// come in batches of one: a batch is always one key's run of messages,
// which is what lets a handler apply it in one transaction.
//
// The handler reports the failed message with keyorder.FailedAt(i, err):
// ds[:i] are acknowledged, ds[i] gets err's outcome as a single handler's
// error would (retry with backoff, keyorder.RetryAfter's delay,
// keyorder.Permanent's dead letter, a dead letter when its attempts run
// out), and ds[i+1:] return to pending in their order, ahead of anything
// else of their key, their attempts not counted. Any other error, and a
// panic, fail the batch at index 0, as does a *keyorder.BatchError whose
// Index is outside the batch (negative, or not below len(ds)): that is
// logged, and message 0's error wraps ErrBatchIndex and the BatchError's
// Err, whose RetryAfter or Permanent still applies. After a dead letter at
// i the key continues at once with i+1.
//
// After a retried failure at i under Ordered, where the process holds keys
// (no native hold) the failed message and those behind it stay in the lane
// as one batch until the retry time; where the broker holds them, the
// failed message is Nacked with its delay and those behind it (and the
// rest of their chain) are Released unrun, and the broker holds the key.
// Under Exclusive and Parallel a failed message may be overtaken, but
// those behind it in its batch never ran, so they do not wait for it: they
// continue at once, as a batch of what is left, before anything else of
// the key, while only message i waits for its retry (Nacked with its
// delay where the broker holds keys, which it still does while the rest is
// leased; as a batch of its own where the process holds them, which later
// messages of its key may overtake).
//
// A member's lost lease cancels the batch's context. The lost member, and
// those behind it, are dropped or released as at a lost lease of a single
// message; a member before it that the cancelled handler then reports
// failed is not at fault, so, as at shutdown, it goes back to the broker
// without counting an attempt.
//
// Batches are assembled in process from what is received, one open batch
// per key, by one goroutine, so a key's batches reach the lanes in order.
// On a broker that holds keys natively (PostgreSQL, SQS) nothing more of a
// key arrives while its messages are leased, so a batch there is at most
// what one receive returns of the key (PostgreSQL's claim chain, an SQS
// receive) and never waits for MaxWait. Config.MaxOutstanding defaults to
// 2×Workers×MaxSize under RunBatch so that batches can fill.
//
// Config.Observer sees every message of a batch as an attempt of its own
// (those after the failed index end OutcomeReleased); the handler's context
// is the one the observer returned for the batch's first message.
// Config.Middleware wraps a per-message HandlerFunc and does not apply to
// batches.
//
// # Who owns what
//
// Each piece of per-message or per-key state has one owner; the others
// read it.
//
//   - Held keys (in-process hold): a key's hold record, made when the
//     key has a message outstanding and dropped when it has none and none
//     parked. It lists the key's outstanding messages and counts those
//     waiting on a time; parking and unparking touch that key's messages
//     only. The lanes (package lanes) own the order in which a key's
//     messages run; the hold record owns only flow control
//     (which messages hold a MaxOutstanding token) and is the one answer
//     to "is this key held here".
//   - Attempts: each attempt is counted once, by whoever makes it happen.
//     The broker's driver counts deliveries (the delivery count it reports, read
//     once at receive; it includes lost leases and, for SQS, excludes the
//     library's own put-backs). The Subscriber counts the retries it runs in
//     process (no native hold), which the broker never sees. The message's
//     attempt is the one value the handler (Delivery.Attempt), the budget
//     (MaxAttempts), the dead letter's count and the Observer see. A
//     driver that can record starts is told right before each run (a
//     batch's members together) that the handler starts, so that a lost
//     lease counts only messages that ran (PostgreSQL). A message is
//     dead-lettered for its attempts after a run of its own failed;
//     before a run only when its count is past MaxAttempts+1 (lost
//     deliveries it may never have run used it up: it gets one run, and
//     MaxAttempts+1 runs bound a message that kills every process running
//     it), or past MaxAttempts where the driver records starts. A
//     driver that records starts is told of a batch with all its members;
//     the starts of those behind a failed one, which never ran, are not
//     the message's attempts: its redelivery here takes them off, and a
//     driver that takes messages back with a count gets its own.
//   - Chains: the driver owns what the broker leases together (the
//     PostgreSQL claim's chain of one key, held until every member is
//     settled; an SQS receive of one group); the Subscriber owns what it
//     does with them in process (run in order; when one fails or waits,
//     hand the rest back unrun). Neither decides the other's part.
//
// # Settlement under a flaky network
//
// Settling a message (Ack, Nack, Release, DeadLetter) and renewing leases
// (ExtendLeases) are retried with backoff while the driver reports the error
// retryable (the driver classifies its errors), a bounded number of times
// within a bounded time; drivers never retry on their own. A Nack, Release
// or DeadLetter is retried on the message's lane, so under Ordered the key
// moves on only after the broker has the settlement; acknowledgements are
// retried beside the batching acker, so one failing batch does not hold the
// others. A settlement given up (a permanent error, or retries exhausted) is
// logged and counted in Stats.SettleFailures and the message is left to the
// broker, which redelivers it when its lease expires; a redelivered message
// whose handler already succeeded is acknowledged without running again,
// and one this process dead-lettered is dead-lettered again (with its
// reason and attempts), also without running. That goes for a redelivery
// of the same copy only (the broker's copy of the message, as its driver
// names it): a DeadLetter call that failed may have taken effect, and the
// message, redriven (by Redrive or by another process), is a new copy and
// runs.
package subscribe
