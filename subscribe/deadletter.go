package subscribe

// This file: the portable dead-letter operations.

import (
	"context"
	"fmt"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters"
)

// DeadLetters lists the subscription's dead letters, if the backend keeps
// them where they can be listed.
func (s *Subscriber) DeadLetters(ctx context.Context, limit int) ([]adapters.DeadLetter, error) {
	st, ok := s.drv.(adapters.DeadLetterStore)
	if !ok {
		return nil, fmt.Errorf("dead letters: %w", keyorder.ErrUnsupported)
	}
	dls, err := st.DeadLetters(ctx, limit)
	return dls, adapters.WrapError("dead letters", err, s.drv.ErrorCode)
}

// Redrive puts dead letters back on the subscription, after everything that
// arrived meanwhile.
func (s *Subscriber) Redrive(ctx context.Context, ids []string) (int, error) {
	st, ok := s.drv.(adapters.DeadLetterStore)
	if !ok {
		return 0, fmt.Errorf("redrive: %w", keyorder.ErrUnsupported)
	}
	n, err := st.Redrive(ctx, ids)
	return n, adapters.WrapError("redrive", err, s.drv.ErrorCode)
}
