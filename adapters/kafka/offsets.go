package kafka

// This file: the offset map of one assigned partition. Kafka keeps one
// committed offset per partition, but keyorder completes a partition's
// records out of order (keys run in parallel; a failed key is held while
// later keys finish). The map commits the highest contiguous completed
// offset and carries the completed offsets above it in the commit's
// metadata string, so that a restart or rebalance redelivers only what had
// not completed.

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"sort"
	"strings"
)

// metaPrefix starts the metadata strings the driver writes (format 2:
// each attempt entry carries a due time). metaPrefix1 starts format 1,
// which earlier versions wrote and the driver still reads.
// metaPrefixInUse starts format 2 as a member writes it while it owns
// the partition (its periodic commits, and the claim it commits before
// handing out a partition's first record); a revocation, the watchdog
// and Close write metaPrefix. A new owner that finds metaPrefixInUse
// knows the previous one went away without committing (a crash): what it
// ran last may not be recorded.
const (
	metaPrefix      = "ko2."
	metaPrefixInUse = "ko2~"
	metaPrefix1     = "ko1."
)

// metaInUse reports whether meta was written by a member that still owned
// the partition.
func metaInUse(meta string) bool { return strings.HasPrefix(meta, metaPrefixInUse) }

// maxAttemptEntries bounds the attempt counts one commit carries.
const maxAttemptEntries = 64

// entry is one record of a partition handed out (or skipped) since the
// committed base, in offset order.
type entry struct {
	off  int64
	done bool
	d    *delivery // nil for a record skipped as already done
}

// offsetMap tracks one partition's records from its committed base on.
// It is not safe for concurrent use (the subscription's mutex guards it).
type offsetMap struct {
	// base is the offset to commit: every record below it is done. -1
	// until known (no commit and no record yet).
	base int64
	q    []entry // records from base on, in offset order; q[head:] live
	head int
	// runs counts the runs of done entries in q[head:] (what the metadata
	// must carry).
	runs int
	// restored are the offsets a previous owner completed above base, and
	// attempts the attempts it counted for offsets not done, from the
	// committed metadata.
	restored map[int64]bool
	attempts map[int64]int
	// due holds, for offsets not done, when a retry given back at a
	// graceful stop is due (Unix milliseconds).
	due map[int64]int64
}

func newOffsetMap(base int64, meta string) *offsetMap {
	m := &offsetMap{base: base}
	if base >= 0 {
		m.restored, m.attempts, m.due = decodeMeta(base, meta)
	}
	return m
}

func (m *offsetMap) live() []entry { return m.q[m.head:] }

// pending is how many records sit between base and the last one handed
// out (done or not).
func (m *offsetMap) pending() int { return len(m.q) - m.head }

// add appends the record at off (offsets arrive increasing). It reports
// whether the record was already done by a previous owner (then it is
// skipped) and what was committed for it before: the attempts counted
// and when its retry is due.
func (m *offsetMap) add(off int64, d *delivery) (skip bool, prior mark) {
	if m.base < 0 {
		m.base = off
	}
	if off < m.base {
		return true, mark{} // below the committed base: a re-fetch of done work
	}
	if l := m.live(); len(l) > 0 && off <= l[len(l)-1].off {
		return true, mark{} // a duplicate fetch
	}
	if m.restored[off] {
		delete(m.restored, off)
		m.appendEntry(entry{off: off, done: true})
		m.advance()
		return true, mark{}
	}
	prior = mark{m.attempts[off], m.due[off]}
	delete(m.attempts, off)
	delete(m.due, off)
	m.appendEntry(entry{off: off, d: d})
	return false, prior
}

func (m *offsetMap) appendEntry(e entry) {
	if e.done {
		if l := m.live(); len(l) == 0 || !l[len(l)-1].done {
			m.runs++
		}
	}
	m.q = append(m.q, e)
}

// index returns the position of off in q, or -1.
func (m *offsetMap) index(off int64) int {
	l := m.live()
	i := sort.Search(len(l), func(i int) bool { return l[i].off >= off })
	if i < len(l) && l[i].off == off {
		return m.head + i
	}
	return -1
}

// complete marks the record at off done and advances base. It reports
// whether base moved.
func (m *offsetMap) complete(off int64) bool {
	i := m.index(off)
	if i < 0 || m.q[i].done {
		return false
	}
	m.q[i].done = true
	m.q[i].d = nil
	left := i > m.head && m.q[i-1].done
	right := i+1 < len(m.q) && m.q[i+1].done
	switch {
	case left && right:
		m.runs--
	case !left && !right:
		m.runs++
	}
	return m.advance()
}

// advance pops the done records at the front.
func (m *offsetMap) advance() bool {
	moved := false
	for m.head < len(m.q) && m.q[m.head].done {
		m.base = m.q[m.head].off + 1
		m.q[m.head] = entry{}
		m.head++
		moved = true
	}
	if moved {
		m.runs-- // the front run is gone
		if m.head == len(m.q) {
			m.q, m.head = m.q[:0], 0
		} else {
			m.base = m.q[m.head].off // offsets in between do not exist
		}
		if m.head > 1024 && m.head > len(m.q)/2 {
			m.q = append(m.q[:0], m.q[m.head:]...)
			m.head = 0
		}
	}
	return moved
}

// next is the offset after the last record seen (base when none).
func (m *offsetMap) next() int64 {
	if l := m.live(); len(l) > 0 {
		return l[len(l)-1].off + 1
	}
	return m.base
}

// mark is what the metadata carries for a record not done: the attempts
// counted for it and when its retry is due (Unix milliseconds; 0: at
// once).
type mark struct {
	n   int
	due int64
}

// metadata encodes the done offsets above base, and the marks of extra
// (offset -> attempts counted, due time) and of the restored ones, in at
// most maxBytes characters. The attempts go first, the lowest offsets
// first, as many as fit; the done runs fill what they leave. What does
// not fit is left out: a left-out done offset is only redelivered (at
// least once), never lost; a left-out attempt count restarts from the
// last one committed.
func (m *offsetMap) metadata(extra map[int64]mark, maxBytes int) string {
	return m.encode(extra, maxBytes, false)
}

// encode is metadata, with metaPrefixInUse when inUse (then never "").
func (m *offsetMap) encode(extra map[int64]mark, maxBytes int, inUse bool) string {
	prefix := metaPrefix
	if inUse {
		prefix = metaPrefixInUse
	}
	if m.base < 0 {
		return ""
	}
	type att struct {
		off int64
		mark
	}
	var atts []att
	restoredMark := func(off int64) {
		if _, ok := extra[off]; !ok && off >= m.base {
			atts = append(atts, att{off, mark{m.attempts[off], m.due[off]}})
		}
	}
	for off, n := range m.attempts {
		if n > 0 {
			restoredMark(off)
		}
	}
	for off, t := range m.due {
		if t > 0 && m.attempts[off] == 0 {
			restoredMark(off)
		}
	}
	for off, mk := range extra {
		if off >= m.base && (mk.n > 0 || mk.due > 0) {
			atts = append(atts, att{off, mk})
		}
	}
	sort.Slice(atts, func(i, j int) bool { return atts[i].off < atts[j].off })
	if len(atts) > maxAttemptEntries {
		atts = atts[:maxAttemptEntries]
	}
	var restored []int64
	for off := range m.restored {
		if off >= m.next() {
			restored = append(restored, off)
		}
	}
	sort.Slice(restored, func(i, j int) bool { return restored[i] < restored[j] })
	if len(atts) == 0 && m.runs == 0 && len(restored) == 0 {
		if inUse {
			return prefix
		}
		return ""
	}
	limit := (maxBytes - len(metaPrefix)) * 3 / 4 // base64 inflates 4/3
	if limit < 1 {
		return ""
	}
	// The attempt entries that fit (the count takes one byte: at most
	// maxAttemptEntries).
	var entries []byte
	kept := 0
	prev := m.base
	for _, a := range atts {
		n := len(entries)
		entries = binary.AppendUvarint(entries, uint64(a.off-prev))
		entries = binary.AppendUvarint(entries, uint64(a.n))
		entries = binary.AppendUvarint(entries, uint64(a.due))
		if 1+len(entries) > limit {
			entries = entries[:n]
			break
		}
		prev = a.off
		kept++
	}
	buf := make([]byte, 0, 64)
	buf = binary.AppendUvarint(buf, uint64(kept))
	buf = append(buf, entries...)
	// Runs of done offsets: (distance from the end of the previous run,
	// length), relative to base.
	pos := m.base
	emit := func(start, end int64) bool { // [start, end)
		n := len(buf)
		buf = binary.AppendUvarint(buf, uint64(start-pos))
		buf = binary.AppendUvarint(buf, uint64(end-start))
		if len(buf) > limit {
			buf = buf[:n]
			return false
		}
		pos = end
		return true
	}
	runStart := int64(-1)
	var last int64
	ok := true
	for _, e := range m.live() {
		if !ok {
			break
		}
		if e.done {
			if runStart >= 0 && e.off == last+1 {
				last = e.off
				continue
			}
			if runStart >= 0 {
				ok = emit(runStart, last+1)
			}
			runStart, last = e.off, e.off
		} else if runStart >= 0 {
			ok = emit(runStart, last+1)
			runStart = -1
		}
	}
	if ok && runStart >= 0 {
		ok = emit(runStart, last+1)
	}
	for _, off := range restored {
		if !ok {
			break
		}
		if off < pos {
			continue
		}
		ok = emit(off, off+1)
	}
	if len(buf) == 1 && buf[0] == 0 {
		if inUse {
			return prefix
		}
		return ""
	}
	return prefix + base64.RawURLEncoding.EncodeToString(buf)
}

var errBadMeta = errors.New("kafka: commit metadata not written by keyorder")

// decodeMeta reads metadata written by offsetMap.metadata for base (format
// 2, or format 1 of earlier versions, which carries no due times). A
// string not written by the driver (another client's commit) decodes as
// nothing done above base.
func decodeMeta(base int64, meta string) (done map[int64]bool, attempts map[int64]int, due map[int64]int64) {
	done, attempts, due, _ = parseMeta(base, meta)
	return done, attempts, due
}

func parseMeta(base int64, meta string) (map[int64]bool, map[int64]int, map[int64]int64, error) {
	withDue := true
	rest, ok := strings.CutPrefix(meta, metaPrefix)
	if !ok {
		rest, ok = strings.CutPrefix(meta, metaPrefixInUse)
	}
	if !ok {
		if rest, ok = strings.CutPrefix(meta, metaPrefix1); !ok {
			return nil, nil, nil, errBadMeta
		}
		withDue = false
	}
	if rest == "" && withDue {
		return map[int64]bool{}, map[int64]int{}, map[int64]int64{}, nil // a claim with nothing to carry
	}
	buf, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return nil, nil, nil, errBadMeta
	}
	next := func(bound uint64) (int64, bool) {
		v, n := binary.Uvarint(buf)
		if n <= 0 || v > bound {
			return 0, false
		}
		buf = buf[n:]
		return int64(v), true
	}
	na, ok := next(maxAttemptEntries)
	if !ok {
		return nil, nil, nil, errBadMeta
	}
	attempts := map[int64]int{}
	due := map[int64]int64{}
	prev := base
	for range na {
		d, ok1 := next(1 << 40)
		c, ok2 := next(1 << 40)
		var t int64
		ok3 := true
		if withDue {
			t, ok3 = next(1 << 53)
		}
		if !ok1 || !ok2 || !ok3 {
			return nil, nil, nil, errBadMeta
		}
		prev += d
		if c > 0 {
			attempts[prev] = int(c)
		}
		if t > 0 {
			due[prev] = t
		}
	}
	done := map[int64]bool{}
	pos := base
	for len(buf) > 0 {
		gap, ok1 := next(1 << 40)
		n, ok2 := next(1 << 40)
		if !ok1 || !ok2 || n > 1<<20 || len(done)+int(n) > 1<<22 {
			return nil, nil, nil, errBadMeta
		}
		start := pos + gap
		for off := start; off < start+n; off++ {
			done[off] = true
		}
		pos = start + n
	}
	return done, attempts, due, nil
}
