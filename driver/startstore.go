package driver

import "context"

// StartStore keeps, per subscription and message copy, how many times the
// message's handler started. It is what a driver whose broker counts
// deliveries rather than runs (SQS's ApproximateReceiveCount, Pub/Sub's
// delivery attempt) is given to implement StartRecorder: without it, a
// crash counts an attempt for every message the dead process held, started
// or not, and a few crashes dead-letter messages that never ran.
//
// The built-in implementation is the PostgreSQL adapter's
// (postgres.NewStartStore); keyordertest.NewStartStore is an in-memory one
// for tests. A store is shared by every consumer process of a
// subscription: one process reads the runs another recorded.
//
// Keys: sub names the subscription (the driver chooses a name that is
// unique across the store's users: the SQS queue URL, the Pub/Sub
// subscription's full name); id is the broker's ID of the message's copy,
// so a redriven or republished copy starts from no record.
//
// Methods may be called concurrently. A driver calls Runs only for messages
// the broker says were delivered before, Record on starts (lazily, batched,
// off the handlers' path, synchronously for a message that came back
// after an unrecorded loss) and Forget once a recorded message is settled,
// so a consumer whose handlers end sooner than the driver's record delay
// and whose consumers do not crash costs a store no call at all.
//
// A start recorded before its handler runs counts as a run even when the
// handler never begins (the process dies between the write and the call,
// or the lease is lost during the write): a reader cannot tell it from a
// handler killed in its first instant, so each such event can charge a
// message one run it did not make.
type StartStore interface {
	// Runs returns the recorded runs of the messages ids of sub. An id
	// without a record is absent from the result.
	Runs(ctx context.Context, sub string, ids []string) (map[string]int, error)
	// Record raises each id's recorded runs to at least the count given
	// (a record is never lowered: writes of two processes may cross).
	Record(ctx context.Context, sub string, runs map[string]int) error
	// Forget deletes the records of ids (settled messages). Records a
	// Forget missed (a failed call, a process that died) are the store's
	// to expire.
	Forget(ctx context.Context, sub string, ids []string) error
}
