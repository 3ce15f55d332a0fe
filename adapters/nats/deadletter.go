package nats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyorder/keyorder/driver"
)

// Dead-letter headers.
const (
	headerReason   = "Keyorder-Reason"
	headerAttempts = "Keyorder-Attempts"
	headerDeadAt   = "Keyorder-Dead-At"
	headerSubject  = "Keyorder-Subject"
)

// deadSubject is the subscription's subject in the dead-letter stream.
func (s *subscriptionDriver) deadSubject() string { return DeadLetterStream(s.stream) + "." + s.sub }

// ensureDeadStream creates the dead-letter stream if needed.
func (s *subscriptionDriver) ensureDeadStream(ctx context.Context) (jetstream.Stream, error) {
	name := DeadLetterStream(s.stream)
	st, err := s.js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		st, err = s.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.FileStorage})
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			st, err = s.js.Stream(ctx, name)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("nats: dead-letter stream %s: %w", name, err)
	}
	return st, nil
}

func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// DeadLetter stores m with reason and attempts in the dead-letter stream
// (waiting for the server's acknowledgement), then acknowledges m: the
// group continues without it.
func (s *subscriptionDriver) DeadLetter(ctx context.Context, m *driver.Message, reason string, attempts int) error {
	d, err := deliveryOf(m)
	if err != nil {
		return err
	}
	if _, err := s.ensureDeadStream(ctx); err != nil {
		return err
	}
	msg := nats.NewMsg(s.deadSubject())
	msg.Data = d.in.msg.Data()
	for k, vs := range d.in.msg.Headers() {
		if k == nats.MsgIdHdr {
			continue
		}
		for _, v := range vs {
			msg.Header.Add(k, v)
		}
	}
	if m.ID != "" {
		msg.Header.Set(HeaderID, m.ID)
	}
	msg.Header.Set(headerSubject, d.in.msg.Subject())
	msg.Header.Set(headerReason, truncateUTF8(sanitize(reason), maxReason))
	msg.Header.Set(headerAttempts, strconv.Itoa(attempts))
	msg.Header.Set(headerDeadAt, time.Now().UTC().Format(time.RFC3339Nano))
	if _, err := s.js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("nats: dead-letter %q: %w", m.ID, err)
	}
	s.mu.Lock()
	err = s.settle(d)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if err := d.in.msg.Ack(); err != nil {
		return fmt.Errorf("nats: ack dead-lettered %q: %w", m.ID, err)
	}
	return nil
}

// sanitize keeps a header value on one line.
func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '\r' || c == '\n' {
			b[i] = ' '
		}
	}
	return string(b)
}

type deadMsg struct {
	seq uint64
	msg jetstream.Msg
}

// readDead reads the subscription's dead letters, oldest first.
func (s *subscriptionDriver) readDead(ctx context.Context) ([]deadMsg, error) {
	name := DeadLetterStream(s.stream)
	oc, err := s.js.OrderedConsumer(ctx, name, jetstream.OrderedConsumerConfig{FilterSubjects: []string{s.deadSubject()}})
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("nats: read dead letters: %w", err)
	}
	info, err := oc.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("nats: read dead letters: %w", err)
	}
	want := info.NumPending
	var out []deadMsg
	for uint64(len(out)) < want {
		batch, err := oc.Fetch(int(min(want-uint64(len(out)), 256)), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, fmt.Errorf("nats: read dead letters: %w", err)
		}
		n := 0
		for m := range batch.Messages() {
			meta, err := m.Metadata()
			if err != nil {
				continue
			}
			out = append(out, deadMsg{meta.Sequence.Stream, m})
			n++
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("nats: read dead letters: %w", err)
		}
		if n == 0 {
			break
		}
	}
	return out, nil
}

func deadLetterOf(dm deadMsg) driver.DeadLetter {
	h := dm.msg.Headers()
	m := fromMsg(h.Get(headerSubject), h, dm.msg.Data())
	m.Copy = "dead/" + strconv.FormatUint(dm.seq, 10)
	n, _ := strconv.Atoi(h.Get(headerAttempts))
	at, _ := time.Parse(time.RFC3339Nano, h.Get(headerDeadAt))
	return driver.DeadLetter{Message: *m, Reason: h.Get(headerReason), Attempts: n, DeadAt: at}
}

// DeadLetters lists up to limit dead letters, oldest first.
func (s *subscriptionDriver) DeadLetters(ctx context.Context, limit int) ([]driver.DeadLetter, error) {
	dms, err := s.readDead(ctx)
	if err != nil {
		return nil, err
	}
	if limit > 0 && len(dms) > limit {
		dms = dms[:limit]
	}
	out := make([]driver.DeadLetter, len(dms))
	for i, dm := range dms {
		out[i] = deadLetterOf(dm)
	}
	return out, nil
}

// Redrive publishes the dead letters with these IDs to their partition
// again (after what arrived meanwhile, a new copy with a fresh count) and
// deletes them from the dead-letter stream.
func (s *subscriptionDriver) Redrive(ctx context.Context, ids []string) (int, error) {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	dms, err := s.readDead(ctx)
	if err != nil {
		return 0, err
	}
	st, err := s.ensureDeadStream(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	var done []string // the IDs redriven
	for _, dm := range dms {
		h := dm.msg.Headers()
		dl := deadLetterOf(dm)
		if !want[dl.Message.ID] {
			continue
		}
		msg := nats.NewMsg(h.Get(headerSubject))
		msg.Data = dm.msg.Data()
		for k, vs := range h {
			switch k {
			case headerReason, headerAttempts, headerDeadAt, headerSubject, nats.MsgIdHdr:
				continue
			}
			for _, v := range vs {
				msg.Header.Add(k, v)
			}
		}
		msg.Header.Set(HeaderID, dl.Message.ID)
		msg.Header.Set(nats.MsgIdHdr, dl.Message.ID+"/redrive/"+strconv.FormatUint(dm.seq, 10))
		if _, err := s.js.PublishMsg(ctx, msg); err != nil {
			return n, fmt.Errorf("nats: redrive %q: %w", dl.Message.ID, err)
		}
		if err := st.DeleteMsg(ctx, dm.seq); err != nil {
			return n, fmt.Errorf("nats: redrive %q: delete the dead letter: %w", dl.Message.ID, err)
		}
		n++
		done = append(done, dl.Message.ID)
	}
	return n, driver.NotDeadLetters(ids, done)
}
