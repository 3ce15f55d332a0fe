package kafka

import (
	"errors"
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/keyorder/keyorder"
)

// TestErrorCode: the broker's refusals of a bad setting or name are
// InvalidArgument (the session timeout outside the broker's range
// surfaced from Receive as Unknown), unknown topics NotFound, retriable
// errors Unavailable, wrapped or not.
func TestErrorCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want keyorder.ErrorCode
	}{
		{kerr.InvalidSessionTimeout, keyorder.CodeInvalidArgument},
		{kerr.InvalidGroupID, keyorder.CodeInvalidArgument},
		{kerr.InvalidPartitions, keyorder.CodeInvalidArgument},
		{kerr.InvalidReplicationFactor, keyorder.CodeInvalidArgument},
		{kerr.InvalidConfig, keyorder.CodeInvalidArgument},
		{kerr.InvalidTopicException, keyorder.CodeInvalidArgument},
		{kerr.MessageTooLarge, keyorder.CodeInvalidArgument},
		{kerr.UnknownTopicOrPartition, keyorder.CodeNotFound},
		{kerr.TopicAuthorizationFailed, keyorder.CodePermissionDenied},
		{kerr.NotLeaderForPartition, keyorder.CodeUnavailable},
		{errLost, keyorder.CodeFailedPrecondition},
	} {
		for _, err := range []error{tc.err, fmt.Errorf("kafka: fetch t: %w", tc.err)} {
			if got := errorCode(err); got != tc.want {
				t.Errorf("errorCode(%v) = %v, want %v", err, got, tc.want)
			}
		}
	}
	if got := errorCode(errors.New("other")); got != keyorder.CodeUnknown {
		t.Errorf("errorCode(other) = %v", got)
	}
}
