package driverkit

import (
	"errors"
	"testing"
	"time"

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

func TestDeadLetterOf(t *testing.T) {
	at := time.Date(2026, 12, 3, 10, 0, 0, 123, time.UTC)
	pub := at.Add(time.Second)
	m := &driver.Message{ID: "m1", Key: "k", PublishTime: pub, Headers: map[string]string{
		HeaderDeadReason: "permanent: bad", HeaderDeadAttempts: "3", HeaderDeadAt: at.Format(time.RFC3339Nano), "h": "v",
	}}
	dl := DeadLetterOf(m)
	if dl.Reason != "permanent: bad" || dl.Attempts != 3 || !dl.DeadAt.Equal(at) {
		t.Errorf("dead letter %q, %d, %v; want the headers' reason, attempts and time", dl.Reason, dl.Attempts, dl.DeadAt)
	}
	if len(dl.Message.Headers) != 1 || dl.Message.Headers["h"] != "v" || dl.Message.ID != "m1" {
		t.Errorf("message %+v: want the user's header only", dl.Message)
	}
	bare := DeadLetterOf(&driver.Message{PublishTime: pub, Headers: map[string]string{HeaderDeadAt: "yesterday"}})
	if !bare.DeadAt.Equal(pub) || bare.Message.Headers != nil || bare.Reason != "" || bare.Attempts != 0 {
		t.Errorf("malformed time, no reason: %+v; want the publish time and nil headers", bare)
	}
}
