package keyorder_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
)

func TestFailedAt(t *testing.T) {
	base := errors.New("boom")
	err := fmt.Errorf("apply: %w", keyorder.FailedAt(2, keyorder.RetryAfter(base, time.Second)))
	var be *keyorder.BatchError
	if !errors.As(err, &be) || be.Index != 2 {
		t.Fatalf("errors.As(%v) = %+v", err, be)
	}
	var re *keyorder.RetryError
	if !errors.As(err, &re) || re.After != time.Second || !errors.Is(err, base) {
		t.Fatalf("RetryAfter inside FailedAt not found: %v", err)
	}
	i, cause := keyorder.BatchFailure(err)
	if i != 2 || !errors.As(cause, &re) {
		t.Fatalf("BatchFailure = %d, %v", i, cause)
	}
	var pe *keyorder.PermanentError
	if !errors.As(keyorder.FailedAt(1, keyorder.Permanent(base)), &pe) {
		t.Fatal("Permanent inside FailedAt not found")
	}
	if i, cause := keyorder.BatchFailure(base); i != 0 || cause != base {
		t.Fatalf("plain error: BatchFailure = %d, %v", i, cause)
	}
}

// FailedAt never panics: a nil error is success (nil), a negative index is
// the whole batch (index 0).
func TestFailedAtEdges(t *testing.T) {
	if err := keyorder.FailedAt(3, nil); err != nil {
		t.Errorf("FailedAt(3, nil) = %v, want nil", err)
	}
	base := errors.New("boom")
	var be *keyorder.BatchError
	if err := keyorder.FailedAt(-1, base); !errors.As(err, &be) || be.Index != 0 || !errors.Is(err, base) {
		t.Errorf("FailedAt(-1, err) = %#v, want index 0 wrapping err", err)
	}
}

// A nil *BatchError in an error's chain is no failure index: BatchFailure
// must not crash on it (a handler bug, but never a process crash).
func TestBatchFailureNilBatchError(t *testing.T) {
	var be *keyorder.BatchError
	var err error = be
	if i, cause := keyorder.BatchFailure(err); i != 0 || cause != err {
		t.Fatalf("BatchFailure(nil *BatchError) = %d, %v; want 0 and the error itself", i, cause)
	}
}
