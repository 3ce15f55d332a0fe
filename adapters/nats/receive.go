package nats

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyorder/keyorder/driver"
)

// fetch pulls partition p's messages into its backlog until p is stopped,
// keeping at most MaxPending fetched or handed out.
func (s *subscriptionDriver) fetch(p *part) {
	defer close(p.done)
	first := true
	for {
		select {
		case <-p.stop:
			return
		default:
		}
		s.mu.Lock()
		room := s.opts.MaxPending - len(p.backlog) - p.live
		s.mu.Unlock()
		if room <= 0 {
			select {
			case <-p.stop:
				return
			case <-p.wake:
			case <-time.After(fetchWait):
			}
			continue
		}
		room = min(room, 256)
		var batch jetstream.MessageBatch
		var err error
		if first {
			batch, err = p.cons.FetchNoWait(room)
		} else {
			batch, err = p.cons.Fetch(room, jetstream.FetchMaxWait(fetchWait))
		}
		if err == nil {
			for m := range batch.Messages() {
				meta, merr := m.Metadata()
				if merr != nil {
					continue
				}
				in := inMsg{msg: m, meta: meta}
				ctx, cancel := context.WithTimeout(context.Background(), s.tick())
				s.readRun(ctx, &in)
				cancel()
				s.mu.Lock()
				p.backlog = insertBySeq(p.backlog, in)
				if !p.settled0 && meta.Sequence.Stream <= p.leftSeq {
					p.got++
				}
				if !p.settled0 && (p.got >= p.leftover || time.Now().After(p.leftBy)) {
					p.settled0 = true
				}
				s.mu.Unlock()
				s.notify()
			}
			err = batch.Error()
		}
		s.mu.Lock()
		if !p.settled0 && time.Now().After(p.leftBy) {
			p.settled0 = true
		}
		s.mu.Unlock()
		if first {
			s.mu.Lock()
			p.primed = true
			s.mu.Unlock()
			s.notify()
			first = false
		}
		if err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
			select {
			case <-p.stop:
				return
			case <-time.After(fetchWait):
			}
		}
	}
}

// insertBySeq inserts in into b, kept in stream order.
func insertBySeq(b []inMsg, in inMsg) []inMsg {
	b = append(b, in)
	for i := len(b) - 1; i > 0 && b[i].meta.Sequence.Stream < b[i-1].meta.Sequence.Stream; i-- {
		b[i], b[i-1] = b[i-1], b[i]
	}
	return b
}

func (s *subscriptionDriver) notify() {
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

// keepBacklog keeps the fetched messages not handed out yet leased.
func (s *subscriptionDriver) keepBacklog() {
	s.mu.Lock()
	var ms []jetstream.Msg
	for _, p := range s.parts {
		if !p.revoking {
			for _, in := range p.backlog {
				ms = append(ms, in.msg)
			}
		}
	}
	s.mu.Unlock()
	for _, m := range ms {
		_ = m.InProgress()
	}
}

// Receive hands out fetched messages, merged across partitions by stream
// sequence (the order the stream stored them in), once every owned
// partition's first fetch is in.
func (s *subscriptionDriver) Receive(ctx context.Context, maxMessages int) ([]*driver.Message, error) {
	if maxMessages <= 0 || maxMessages > s.opts.MaxBatch {
		maxMessages = s.opts.MaxBatch
	}
	for {
		if err := s.join(ctx); err != nil {
			return nil, err
		}
		s.mu.Lock()
		out := s.handOut(maxMessages)
		s.mu.Unlock()
		if len(out) > 0 {
			return out, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.signal:
		case <-time.After(s.tick()):
		}
	}
}

// handOut moves up to max messages from the backlogs out. Called with
// s.mu held.
func (s *subscriptionDriver) handOut(max int) []*driver.Message {
	var ps []*part
	now := time.Now()
	for _, p := range s.parts {
		// A partition past its ownership deadline (renewals failing) hands
		// nothing out: another process may own it from its expiry on.
		if p.revoking || now.After(p.until) {
			continue
		}
		if !p.primed {
			return nil
		}
		if p.settled0 {
			ps = append(ps, p)
		}
	}
	var out []*driver.Message
	for len(out) < max {
		var best *part
		for _, p := range ps {
			if len(p.backlog) > 0 && (best == nil || p.backlog[0].meta.Sequence.Stream < best.backlog[0].meta.Sequence.Stream) {
				best = p
			}
		}
		if best == nil {
			break
		}
		in := best.backlog[0]
		best.backlog[0] = inMsg{}
		best.backlog = best.backlog[1:]
		d := &delivery{p: best, in: in, deadline: now.Add(s.opts.Lease)}
		best.live++
		s.live[d] = struct{}{}
		out = append(out, s.message(d))
	}
	return out
}

// message converts a fetched message.
func (s *subscriptionDriver) message(d *delivery) *driver.Message {
	in := d.in
	m := fromMsg(in.msg.Subject(), in.msg.Headers(), in.msg.Data())
	seq := in.meta.Sequence.Stream
	m.AckID = d
	m.Attempt = in.runs + 1
	if in.notBefore.After(m.NotBefore) {
		m.NotBefore = in.notBefore
	}
	m.PublishTime = in.meta.Timestamp
	m.Copy = seq
	if m.ID == "" {
		m.ID = s.stream + "/" + strconv.FormatUint(seq, 10)
	}
	return m
}

// fromMsg decodes a keyorder message from its subject, headers and data.
func fromMsg(subject string, h nats.Header, data []byte) *driver.Message {
	m := &driver.Message{Payload: data}
	if i := strings.LastIndexByte(subject, '.'); i >= 0 {
		m.Key = keyFromToken(subject[i+1:], h)
	}
	m.ID = h.Get(HeaderID)
	if m.ID == "" {
		m.ID = h.Get(nats.MsgIdHdr)
	}
	if v := h.Get(HeaderNotBefore); v != "" {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			m.NotBefore = t
		}
	}
	if v := h.Get(HeaderHeaders); v != "" {
		_ = json.Unmarshal([]byte(v), &m.Headers)
	}
	return m
}
