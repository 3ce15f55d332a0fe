package subscribe

// This file: the portable dead-letter operations.

import (
	"context"
	"fmt"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters"
)

// DeadLetters lists up to limit of the subscription's dead letters, oldest
// first (limit <= 0 lists them all), if the backend keeps them where they can
// be listed; else it fails with keyorder.ErrUnsupported.
func (s *Subscriber) DeadLetters(ctx context.Context, limit int) ([]keyorder.DeadLetter, error) {
	st, ok := s.drv.(adapters.DeadLetterStore)
	if !ok {
		return nil, fmt.Errorf("dead letters: %w", keyorder.ErrUnsupported)
	}
	dls, err := st.DeadLetters(ctx, limit)
	if err != nil {
		return nil, adapters.WrapError("dead letters", err, s.drv.ErrorCode)
	}
	out := make([]keyorder.DeadLetter, len(dls))
	for i, dl := range dls {
		out[i] = keyorder.DeadLetter{Message: dl.Message.Portable(), Reason: dl.Reason, Attempts: dl.Attempts, DeadAt: dl.DeadAt}
	}
	return out, nil
}

// Redrive puts the dead letters with these message IDs back on the
// subscription, after everything that arrived meanwhile, with a fresh
// attempt count, and returns how many it redrove. It fails with
// keyorder.ErrUnsupported where the backend keeps no dead letters it can
// redrive.
func (s *Subscriber) Redrive(ctx context.Context, ids []string) (int, error) {
	st, ok := s.drv.(adapters.DeadLetterStore)
	if !ok {
		return 0, fmt.Errorf("redrive: %w", keyorder.ErrUnsupported)
	}
	n, err := st.Redrive(ctx, ids)
	return n, adapters.WrapError("redrive", err, s.drv.ErrorCode)
}
