package postgres_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/policy"
)

// Out-of-range enums in Options are rejected before any connection is
// used, naming the field.
func TestOptionsRejectUnknownEnums(t *testing.T) {
	for field, o := range map[string]*postgres.Options{
		"MissingKey": {MissingKey: policy.MissingKey(99)},
		"Ordering":   {Subscription: &postgres.SubscriptionOptions{Ordering: policy.Ordering(-1)}},
	} {
		if _, err := postgres.NewAdmin(nil, o); !errors.Is(err, keyorder.ErrInvalidConfig) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s out of range: %v, want ErrInvalidConfig naming it", field, err)
		}
	}
}
