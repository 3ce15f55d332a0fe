package kafka

// This file: receiving. Fetched records become per-partition backlogs, and
// Receive hands out at most one record per key at a time, partitions
// served fairly (partHeap).

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyorder/keyorder/driver"
)

// Receive waits for at least one record or ctx, and returns at most
// maxMessages, each partition's in offset order (a key's records are in
// one partition) and, across partitions, merged by record timestamp (see
// handOut).
func (s *subscriptionDriver) Receive(ctx context.Context, maxMessages int) ([]*driver.Message, error) {
	if maxMessages <= 0 || maxMessages > s.opts.MaxBatch {
		maxMessages = s.opts.MaxBatch
	}
	for {
		g, err := s.current()
		if err != nil {
			return nil, err
		}
		// Take what the client has buffered already, without waiting, so
		// that the merge sees every partition's records fetched by now
		// and not only the first partitions of a fetch. The backlogs this
		// fills hold fewer than MaxBatch records (plus one poll).
		s.mu.Lock()
		room := s.opts.MaxBatch - backlogLen(g)
		s.mu.Unlock()
		var ferr error
		if room > 0 {
			// A nil context makes PollRecords return at once with what is
			// buffered (its documented non-blocking form).
			//lint:ignore SA1012 franz-go's non-blocking poll takes a nil context
			ferr = s.take(g, g.cl.PollRecords(nil, room))
		}
		if err := s.claim(ctx, g); err != nil && ctx.Err() == nil {
			s.opts.Logger.Warn("keyorder: kafka: claiming partitions failed; retried", "topic", s.topic, "group", s.group, "err", err)
		}
		s.mu.Lock()
		if out := s.handOut(g, maxMessages, nil); len(out) > 0 {
			s.mu.Unlock()
			return out, nil
		}
		if ferr != nil && !isRetryable(ferr) {
			s.mu.Unlock()
			return nil, fmt.Errorf("kafka: fetch %s: %w", s.topic, ferr)
		}
		pctx, cancel := context.WithCancel(ctx)
		s.wake = cancel
		s.mu.Unlock()
		fs := g.cl.PollRecords(pctx, s.opts.MaxBatch)
		cancel()
		s.mu.Lock()
		s.wake = nil
		s.mu.Unlock()
		if fs.IsClientClosed() {
			continue // the watchdog gave the member up, or Close
		}
		// Records polled as ctx ended wait in the backlog for the next
		// Receive (the client's cursor is past them).
		ferr = s.take(g, fs)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := s.claim(ctx, g); err != nil && ctx.Err() == nil {
			s.opts.Logger.Warn("keyorder: kafka: claiming partitions failed; retried", "topic", s.topic, "group", s.group, "err", err)
		}
		s.mu.Lock()
		out := s.handOut(g, maxMessages, nil)
		s.mu.Unlock()
		if len(out) > 0 {
			return out, nil
		}
		if ferr != nil && !isRetryable(ferr) {
			return nil, fmt.Errorf("kafka: fetch %s: %w", s.topic, ferr)
		}
	}
}

// take appends the records of fs to their partitions' backlogs and
// returns the first fetch error (each is logged).
func (s *subscriptionDriver) take(g *generation, fs kgo.Fetches) error {
	var ferr error
	fs.EachError(func(t string, p int32, err error) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, kgo.ErrClientClosed) {
			return
		}
		if ferr == nil {
			ferr = err
		}
		s.opts.Logger.Warn("keyorder: kafka: fetch error", "topic", t, "partition", p, "err", err)
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		if st := g.parts[p.Partition]; st != nil && p.Topic == s.topic && st.unclean && st.suspect == math.MaxInt64 && p.HighWatermark >= 0 {
			st.suspect = p.HighWatermark
		}
	})
	fs.EachRecord(func(r *kgo.Record) {
		if st := g.parts[r.Partition]; st != nil && !st.revoking && r.Topic == s.topic {
			st.backlog = append(st.backlog, r)
		}
	})
	return ferr
}

// backlogLen is how many fetched records wait in g's backlogs. Called
// with s.mu held.
func backlogLen(g *generation) int {
	n := 0
	for _, st := range g.parts {
		n += len(st.backlog)
	}
	return n
}

// handOut moves up to max records from the partitions' backlogs into
// their offset maps and returns them, pausing the partitions that reached
// their bounds and resuming those that are below them again. Called with
// s.mu held.
//
// The backlogs are merged by record timestamp (ties by partition), each
// partition's in offset order: Kafka orders records only within a
// partition, so a process handed each partition's backlog in turn would
// see a record published late on one partition before one published
// early on another, and the subscriber, which runs the oldest deliverable
// message first, would run them in that order. Merged, the process sees
// what was fetched together in about publish order, as on the other
// backends (the timestamps are the producers' clocks, in milliseconds).
func (s *subscriptionDriver) handOut(g *generation, max int, out []*driver.Message) []*driver.Message {
	if g.expired {
		return out
	}
	s.gated = false
	if a := s.alone; a != nil && !a.settled && !a.lost {
		s.gated = true // a charged suspect runs alone
		return out
	}
	s.alone = nil
	h := make(partHeap, 0, len(g.parts))
	for _, st := range g.parts {
		if st.claimed && !st.revoking && len(st.backlog) > 0 && !s.full(st) {
			h = append(h, st)
		}
	}
	heap.Init(&h)
	now := time.Now()
	for len(h) > 0 && len(out) < max {
		st := h[0]
		r := st.backlog[0]
		suspect := st.unclean && r.Offset < st.suspect
		if n := s.suspectsOut(st); suspect && n > 0 && n+len(st.om.attempts) >= s.markRoom() {
			// Its start could not be recorded: the partition waits
			// until a suspect handed out completes.
			heap.Pop(&h)
			continue
		}
		charged := suspect && st.om.attempts[r.Offset] > 0
		if charged && (len(s.live) > 0 || len(out) > 0) {
			// A record that was running when the previous owner died
			// waits until nothing else runs here: if it kills this
			// process too, no other record is charged for it.
			s.gated = true
			break
		}
		st.backlog[0] = nil
		st.backlog = st.backlog[1:]
		if len(st.backlog) == 0 {
			st.backlog = nil
		}
		d := &delivery{ps: st, off: r.Offset, deadline: now.Add(s.opts.Lease)}
		skip, prior := st.om.add(r.Offset, d)
		if skip {
			st.dirty = true
		} else {
			d.prior, d.due = prior.n, prior.due
			d.suspect = st.unclean && r.Offset < st.suspect
			st.inflight++
			s.live[d] = struct{}{}
			out = append(out, s.message(r, d))
			if charged {
				s.alone = d
				break
			}
		}
		if len(st.backlog) == 0 || s.full(st) {
			heap.Pop(&h)
		} else {
			heap.Fix(&h, 0)
		}
	}
	// Only a partition at its bounds is paused: one with a backlog is not
	// polled for more anyway (Receive polls again when nothing can be
	// handed out, or while the backlogs hold fewer than MaxBatch), and a
	// pause drops what the client buffered for the partition and keeps
	// it out of the fetch in flight (up to FetchMaxWait) once resumed.
	var pause, resume []int32
	for _, st := range g.parts {
		if st.revoking {
			continue
		}
		switch full := s.full(st); {
		case full && !st.paused:
			st.paused = true
			pause = append(pause, st.p)
		case !full && st.paused:
			st.paused = false
			resume = append(resume, st.p)
		}
	}
	if len(pause) > 0 {
		g.fetch.PauseFetchPartitions(map[string][]int32{s.topic: pause})
	}
	if len(resume) > 0 {
		g.fetch.ResumeFetchPartitions(map[string][]int32{s.topic: resume})
	}
	return out
}

// markRoom is how many attempt counts the commit metadata is sure to
// carry: an entry takes at most 15 bytes (offset distance, count, due
// time), maxAttemptEntries at most.
func (s *subscriptionDriver) markRoom() int {
	return min(maxAttemptEntries, (s.opts.MaxMetadataBytes-len(metaPrefix))*3/4/15)
}

// suspectsOut counts st's suspects handed out and not done. With the
// attempt counts restored for records not handed out yet, that is what
// the metadata must carry; one suspect is always let through. Called with
// s.mu held.
func (s *subscriptionDriver) suspectsOut(st *partState) int {
	if !st.unclean || len(st.backlog) == 0 || st.backlog[0].Offset >= st.suspect {
		return 0
	}
	n := 0
	for _, e := range st.om.live() {
		if !e.done && e.d != nil && e.d.suspect {
			n++
		}
	}
	return n
}

// partHeap orders partitions by the timestamp of their backlog's first
// record, then by partition.
type partHeap []*partState

func (h partHeap) Len() int { return len(h) }

func (h partHeap) Less(i, j int) bool {
	a, b := h[i].backlog[0].Timestamp, h[j].backlog[0].Timestamp
	if !a.Equal(b) {
		return a.Before(b)
	}
	return h[i].p < h[j].p
}

func (h partHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }

func (h *partHeap) Push(x any) { *h = append(*h, x.(*partState)) }

func (h *partHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return x
}

// full reports whether st may hand out no more records: too many pending
// above its committed offset, or too many done runs for the metadata.
func (s *subscriptionDriver) full(st *partState) bool {
	return st.om.pending() >= s.opts.MaxPending || st.om.runs >= s.opts.MaxMetadataBytes/12
}

// message converts a record: its key becomes Key, the reserved headers ID
// and NotBefore, the rest Headers.
func (s *subscriptionDriver) message(r *kgo.Record, d *delivery) *driver.Message {
	m := fromRecord(r)
	m.AckID = d
	m.Attempt = d.prior + 1
	if d.due > 0 {
		// A retry given back at a graceful stop (Return) is held until
		// it was due, as a not-before time is.
		if due := time.UnixMilli(d.due); due.After(m.NotBefore) {
			m.NotBefore = due
		}
	}
	m.Copy = position{r.Partition, r.Offset}
	return m
}

func fromRecord(r *kgo.Record) *driver.Message {
	m := &driver.Message{Key: string(r.Key), Payload: r.Value, PublishTime: r.Timestamp}
	for _, h := range r.Headers {
		switch h.Key {
		case HeaderID:
			m.ID = string(h.Value)
			continue
		case HeaderNotBefore:
			if t, err := time.Parse(time.RFC3339Nano, string(h.Value)); err == nil {
				m.NotBefore = t
			}
			continue
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string, len(r.Headers))
		}
		m.Headers[h.Key] = string(h.Value)
	}
	if m.ID == "" {
		m.ID = r.Topic + "/" + strconv.Itoa(int(r.Partition)) + "/" + strconv.FormatInt(r.Offset, 10)
	}
	return m
}
