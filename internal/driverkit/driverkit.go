// Package driverkit holds what the portable packages and the built-in
// drivers share but a driver author outside this repository has no need of:
// the one conversion from an application's keyorder.Message to a validated
// driver.Message. It is internal so the driver package stays the contract
// alone (what a backend implements and what it may call), as
// database/sql/driver is.
package driverkit

import (
	"context"
	"errors"
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

// Portable returns the one body of every adapter's typed constructor
// (OpenTopic, OpenSubscription): given what the adapter's driver opener
// returned, it hands the driver to newPortable (publish.New or
// subscribe.New) with cfg and returns the portable type, or the opener's
// error. If newPortable refuses the driver (a bad cfg), the driver is
// closed and both errors are returned, so a failed constructor leaves
// nothing open. The call reads
//
//	return driverkit.Portable(publish.New, cfg)(openTopic(ctx, client, name, opts))
//
// It takes the constructor as a value so that this package stays below
// publish and subscribe.
func Portable[D interface{ Close() error }, C, P any](newPortable func(D, C) (P, error), cfg C) func(D, error) (P, error) {
	return func(drv D, err error) (P, error) {
		var zero P
		if err != nil {
			return zero, err
		}
		p, err := newPortable(drv, cfg)
		if err != nil {
			return zero, errors.Join(err, drv.Close())
		}
		return p, nil
	}
}

// DeadLog folds a dead-letter log kept as an append-only stream (a Kafka
// or Pulsar topic): dead letters, and markers saying that the dead letter
// with some ID was redriven. Add and Redriven are called in the log's
// order; Letters returns the dead letters not redriven since, in the order
// their IDs first appeared, each as last written.
type DeadLog struct {
	order []string
	byID  map[string]driver.DeadLetter
}

// Add records a dead letter.
func (l *DeadLog) Add(dl driver.DeadLetter) {
	if l.byID == nil {
		l.byID = map[string]driver.DeadLetter{}
	}
	if _, seen := l.byID[dl.Message.ID]; !seen {
		l.order = append(l.order, dl.Message.ID)
	}
	l.byID[dl.Message.ID] = dl
}

// Redriven records a marker: the dead letter with id, as far as the log
// has gone, was redriven.
func (l *DeadLog) Redriven(id string) { delete(l.byID, id) }

// Letters returns the dead letters not redriven, oldest first.
func (l *DeadLog) Letters() []driver.DeadLetter {
	out := make([]driver.DeadLetter, 0, len(l.byID))
	done := make(map[string]bool, len(l.byID))
	for _, id := range l.order {
		if dl, ok := l.byID[id]; ok && !done[id] {
			out = append(out, dl)
			done[id] = true
		}
	}
	return out
}

// LogStore is DeadLetters and Redrive over a dead-letter log (DeadLog):
// one implementation for the backends that keep their dead letters on a
// topic of the broker and mark a redrive by appending to it.
type LogStore struct {
	// Read returns the log's dead letters not redriven, oldest first.
	Read func(ctx context.Context) ([]driver.DeadLetter, error)
	// Ready, when set, is called by Redrive after Read and before anything
	// is republished (to make the producers); its error is returned as is.
	Ready func() error
	// Republish sends m (its not-before time cleared) to the topic again,
	// after everything sent meanwhile.
	Republish func(ctx context.Context, m *driver.Message) error
	// MarkRedriven appends to the log the marker that id was redriven.
	MarkRedriven func(ctx context.Context, id string) error
}

// DeadLetters lists up to limit dead letters (all when limit <= 0), oldest
// first.
func (s LogStore) DeadLetters(ctx context.Context, limit int) ([]driver.DeadLetter, error) {
	dls, err := s.Read(ctx)
	if err != nil {
		return nil, err
	}
	if limit > 0 && len(dls) > limit {
		dls = dls[:limit]
	}
	return dls, nil
}

// Redrive republishes the dead letters with these IDs, without their
// not-before time, and marks each redriven. It returns how many it
// republished; when marking one fails, that one is counted (it was
// republished) and the error returned. IDs that are not dead letters make
// it fail after the others with driver.NotDeadLetters' error.
func (s LogStore) Redrive(ctx context.Context, ids []string) (int, error) {
	dls, err := s.Read(ctx)
	if err != nil {
		return 0, err
	}
	if s.Ready != nil {
		if err := s.Ready(); err != nil {
			return 0, err
		}
	}
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	n := 0
	var done []string // the IDs redriven
	for _, dl := range dls {
		if !want[dl.Message.ID] {
			continue
		}
		m := dl.Message
		m.NotBefore = time.Time{}
		if err := s.Republish(ctx, &m); err != nil {
			return n, err
		}
		if err := s.MarkRedriven(ctx, m.ID); err != nil {
			return n + 1, err
		}
		n++
		done = append(done, m.ID)
	}
	return n, driver.NotDeadLetters(ids, done)
}
