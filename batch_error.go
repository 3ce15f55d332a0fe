package keyorder

import (
	"errors"
	"fmt"
)

// BatchError reports which message of a batch failed: a batch handler
// (subscribe.BatchHandlerFunc) returns it, made with FailedAt, to say that
// the messages before Index succeeded and the message at Index failed with
// Err. Err decides that message's fate as a single handler's error would:
// wrapped by RetryAfter it is retried not before the delay, wrapped by
// Permanent it is dead-lettered, otherwise it is retried with backoff. The
// messages after Index were not handled; they return to pending, in order.
//
// A batch handler's error that is not a *BatchError fails the batch at
// index 0.
type BatchError struct {
	// Index is the failed message's position in the batch, from 0.
	Index int
	// Err is the failed message's error.
	Err error
}

// FailedAt returns a *BatchError: the messages of a batch before i
// succeeded, message i failed with err, and those after i were not handled.
// FailedAt(0, err) means the same as err. A negative i counts as 0: the
// whole batch failed. An i beyond the batch is a handler bug: the subscriber
// fails the batch at index 0 with an error matching subscribe.ErrBatchIndex
// that wraps err (so a RetryAfter or Permanent inside still applies).
//
// It returns nil when err is nil, so `return keyorder.FailedAt(i, err)`
// after a successful call acknowledges the whole batch.
func FailedAt(i int, err error) error {
	if err == nil {
		return nil
	}
	return &BatchError{Index: max(i, 0), Err: err}
}

// Error implements error.
func (e *BatchError) Error() string {
	return fmt.Sprintf("batch failed at message %d: %v", e.Index, e.Err)
}

// Unwrap returns the failed message's error, so errors.As finds a
// *RetryError or *PermanentError inside.
func (e *BatchError) Unwrap() error { return e.Err }

// BatchFailure returns where err says a batch failed and the error of the
// failed message: the Index and Err of the first *BatchError in err's chain,
// or 0 and err itself. A nil *BatchError in the chain counts as none.
func BatchFailure(err error) (index int, cause error) {
	var be *BatchError
	if errors.As(err, &be) && be != nil {
		return be.Index, be.Err
	}
	return 0, err
}
