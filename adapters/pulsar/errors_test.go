package pulsar

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/keyorder/keyorder"
)

// The client's send errors are classified for the portable layer: transient
// ones retried (and then the key paused), the rest not.
func TestSendErrorsClassified(t *testing.T) {
	for _, c := range []struct {
		err       error
		retryable bool
		code      keyorder.ErrorCode
	}{
		{pulsar.ErrSendTimeout, true, keyorder.CodeUnavailable},
		{pulsar.ErrSendQueueIsFull, true, keyorder.CodeResourceExhausted},
		{pulsar.ErrMemoryBufferIsFull, true, keyorder.CodeResourceExhausted},
		{pulsar.ErrProducerBlockedQuotaExceeded, true, keyorder.CodeResourceExhausted},
		{pulsar.ErrMessageTooLarge, false, keyorder.CodeInvalidArgument},
		{pulsar.ErrMetaTooLarge, false, keyorder.CodeInvalidArgument},
		{pulsar.ErrTopicNotfound, false, keyorder.CodeNotFound},
		{pulsar.ErrTopicTerminated, false, keyorder.CodeFailedPrecondition},
		{pulsar.ErrProducerClosed, false, keyorder.CodeFailedPrecondition},
		{pulsar.ErrProducerFenced, false, keyorder.CodeFailedPrecondition},
		{pulsar.ErrContextExpired, false, keyorder.CodeCanceled},
		{context.Canceled, false, keyorder.CodeCanceled},
		{fmt.Errorf("%w: x", ErrOrderingMismatch), false, keyorder.CodeFailedPrecondition},
		{errors.New("something else"), false, keyorder.CodeUnknown},
	} {
		wrapped := fmt.Errorf("pulsar: send: %w", c.err)
		if got := isRetryable(wrapped); got != c.retryable {
			t.Errorf("isRetryable(%v) = %v, want %v", c.err, got, c.retryable)
		}
		if got := errorCode(wrapped); got != c.code {
			t.Errorf("errorCode(%v) = %v, want %v", c.err, got, c.code)
		}
	}
}
