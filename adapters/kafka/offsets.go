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

// metaPrefix starts the metadata strings the driver writes (format 1).
const metaPrefix = "ko1."

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
}

func newOffsetMap(base int64, meta string) *offsetMap {
	m := &offsetMap{base: base}
	if base >= 0 {
		m.restored, m.attempts = decodeMeta(base, meta)
	}
	return m
}

func (m *offsetMap) live() []entry { return m.q[m.head:] }

// pending is how many records sit between base and the last one handed
// out (done or not).
func (m *offsetMap) pending() int { return len(m.q) - m.head }

// add appends the record at off (offsets arrive increasing). It reports
// whether the record was already done by a previous owner (then it is
// skipped) and the attempts counted for it before.
func (m *offsetMap) add(off int64, d *delivery) (skip bool, attempts int) {
	if m.base < 0 {
		m.base = off
	}
	if off < m.base {
		return true, 0 // below the committed base: a re-fetch of done work
	}
	if l := m.live(); len(l) > 0 && off <= l[len(l)-1].off {
		return true, 0 // a duplicate fetch
	}
	if m.restored[off] {
		delete(m.restored, off)
		m.appendEntry(entry{off: off, done: true})
		m.advance()
		return true, 0
	}
	attempts = m.attempts[off]
	delete(m.attempts, off)
	m.appendEntry(entry{off: off, d: d})
	return false, attempts
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

// metadata encodes the done offsets above base, and the attempt counts
// of extra (offset -> attempts counted) and of the restored ones, in at
// most maxBytes characters. What does not fit is left out: a left-out done
// offset is only redelivered (at least once), never lost.
func (m *offsetMap) metadata(extra map[int64]int, maxBytes int) string {
	if m.base < 0 {
		return ""
	}
	// Attempts first (few), then the done runs.
	type att struct {
		off int64
		n   int
	}
	var atts []att
	for off, n := range m.attempts {
		if off >= m.base && n > 0 {
			atts = append(atts, att{off, n})
		}
	}
	for off, n := range extra {
		if off >= m.base && n > 0 {
			atts = append(atts, att{off, n})
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
		return ""
	}
	limit := (maxBytes - len(metaPrefix)) * 3 / 4 // base64 inflates 4/3
	buf := make([]byte, 0, 64)
	buf = binary.AppendUvarint(buf, uint64(len(atts)))
	prev := m.base
	for _, a := range atts {
		buf = binary.AppendUvarint(buf, uint64(a.off-prev))
		buf = binary.AppendUvarint(buf, uint64(a.n))
		prev = a.off
	}
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
		return ""
	}
	return metaPrefix + base64.RawURLEncoding.EncodeToString(buf)
}

var errBadMeta = errors.New("kafka: commit metadata not written by keyorder")

// decodeMeta reads metadata written by offsetMap.metadata for base. A
// string not written by the driver (another client's commit) decodes as
// nothing done above base.
func decodeMeta(base int64, meta string) (done map[int64]bool, attempts map[int64]int) {
	done, attempts, _ = parseMeta(base, meta)
	return done, attempts
}

func parseMeta(base int64, meta string) (map[int64]bool, map[int64]int, error) {
	rest, ok := strings.CutPrefix(meta, metaPrefix)
	if !ok {
		return nil, nil, errBadMeta
	}
	buf, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return nil, nil, errBadMeta
	}
	next := func() (int64, bool) {
		v, n := binary.Uvarint(buf)
		if n <= 0 || v > 1<<40 {
			return 0, false
		}
		buf = buf[n:]
		return int64(v), true
	}
	na, ok := next()
	if !ok || na > maxAttemptEntries {
		return nil, nil, errBadMeta
	}
	attempts := map[int64]int{}
	prev := base
	for range na {
		d, ok1 := next()
		c, ok2 := next()
		if !ok1 || !ok2 {
			return nil, nil, errBadMeta
		}
		prev += d
		attempts[prev] = int(c)
	}
	done := map[int64]bool{}
	pos := base
	for len(buf) > 0 {
		gap, ok1 := next()
		n, ok2 := next()
		if !ok1 || !ok2 || n > 1<<20 || len(done)+int(n) > 1<<22 {
			return nil, nil, errBadMeta
		}
		start := pos + gap
		for off := start; off < start+n; off++ {
			done[off] = true
		}
		pos = start + n
	}
	return done, attempts, nil
}
