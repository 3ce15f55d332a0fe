// Package driverkit holds what the portable packages and the built-in
// drivers share but a driver author outside this repository has no need of:
// the one conversion from an application's keyorder.Message to a validated
// driver.Message. It is internal so the driver package stays the contract
// alone (what a backend implements and what it may call), as
// database/sql/driver is.
package driverkit

import (
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
)

// Prepare resolves m's ordering key (Message.Key, then the partition-key
// header, then defaultKey), rejects a keyless message with
// keyorder.ErrMissingKey when rejectMissing is set, and converts and
// validates it against lim with Validate. The driver message gets a UUIDv7
// ID (keyorder.NewID) when m has none; m itself is never modified. It
// is the one validation every publishing path shares (publish.Publisher,
// the PostgreSQL outbox's PublishTx), so they accept and reject exactly the
// same messages.
func Prepare(m *keyorder.Message, defaultKey string, rejectMissing bool, lim driver.Limits) (*driver.Message, error) {
	am := new(driver.Message)
	if err := PrepareTo(am, m, defaultKey, rejectMissing, lim); err != nil {
		return nil, err
	}
	return am, nil
}

// PrepareTo is Prepare writing the driver message into dst (every field
// overwritten) instead of allocating it, for publishing paths that allocate
// their driver messages several at a time. On error dst holds no valid
// message.
func PrepareTo(dst *driver.Message, m *keyorder.Message, defaultKey string, rejectMissing bool, lim driver.Limits) error {
	if m == nil {
		return fmt.Errorf("%w: nil message", keyorder.ErrInvalidMessage)
	}
	key := m.Key
	if key == "" {
		key = m.Headers[keyorder.HeaderPartitionKey]
	}
	if key == "" {
		key = defaultKey
	}
	if key == "" && rejectMissing {
		return keyorder.ErrMissingKey
	}
	var headers map[string]string
	if len(m.Headers) > 0 {
		headers = maps.Clone(m.Headers)
		delete(headers, keyorder.HeaderPartitionKey)
		if len(headers) == 0 {
			headers = nil
		}
	}
	*dst = driver.Message{ID: m.ID, Key: key, Payload: m.Payload, Headers: headers, NotBefore: m.NotBefore}
	if err := driver.Validate(lim, dst); err != nil {
		return err
	}
	if dst.ID == "" {
		dst.ID = keyorder.NewID()
	}
	return nil
}

// The headers of a dead letter kept as a message on a dead-letter topic
// (Pulsar, Kafka): why, after how many attempts, and when it died.
const (
	HeaderDeadReason   = "keyorder-reason"
	HeaderDeadAttempts = "keyorder-attempts"
	HeaderDeadAt       = "keyorder-dead-at"
)

// DeadLetterOf reads the dead letter kept as m on a dead-letter topic: its
// reason, attempts and time from the dead-letter headers, which it removes
// from m (m's headers become nil when none are left), and m itself. A
// missing or malformed time leaves m's publish time.
func DeadLetterOf(m *driver.Message) driver.DeadLetter {
	dl := driver.DeadLetter{DeadAt: m.PublishTime}
	if v, ok := m.Headers[HeaderDeadReason]; ok {
		dl.Reason = v
	}
	if v, ok := m.Headers[HeaderDeadAttempts]; ok {
		dl.Attempts, _ = strconv.Atoi(v)
	}
	if v, ok := m.Headers[HeaderDeadAt]; ok {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			dl.DeadAt = t
		}
	}
	delete(m.Headers, HeaderDeadReason)
	delete(m.Headers, HeaderDeadAttempts)
	delete(m.Headers, HeaderDeadAt)
	if len(m.Headers) == 0 {
		m.Headers = nil
	}
	dl.Message = *m
	return dl
}
