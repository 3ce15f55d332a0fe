package driverkit

import (
	"errors"
	"testing"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
)

func TestPrepare(t *testing.T) {
	m := &keyorder.Message{Headers: map[string]string{keyorder.HeaderPartitionKey: "hk", "a": "1"}}
	am, err := Prepare(m, "dk", true, driver.Limits{})
	if err != nil || am.Key != "hk" || len(am.Headers) != 1 || am.ID == "" || m.ID != "" {
		t.Fatalf("Prepare = %+v, %v (m.ID %q: the caller's message must not change)", am, err, m.ID)
	}
	if _, err := Prepare(&keyorder.Message{}, "", true, driver.Limits{}); !errors.Is(err, keyorder.ErrMissingKey) {
		t.Fatalf("keyless: %v", err)
	}
	bad := &keyorder.Message{Key: "k", Headers: map[string]string{"a": "\x00"}}
	if _, err := Prepare(bad, "", true, driver.Limits{}); !errors.Is(err, keyorder.ErrInvalidMessage) || bad.ID != "" {
		t.Fatalf("invalid: %v (ID %q: a rejected message gets no ID)", err, bad.ID)
	}
}
