package kafka

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/keyorder/keyorder"
)

// TestOffsetMapCommitsContiguous: base moves only over completed records;
// the completed ones above it travel in the metadata, and a new owner
// restoring it skips exactly those.
func TestOffsetMapCommitsContiguous(t *testing.T) {
	m := newOffsetMap(10, "")
	for off := int64(10); off < 20; off++ {
		if skip, _ := m.add(off, &delivery{}); skip {
			t.Fatalf("offset %d skipped on a fresh map", off)
		}
	}
	for _, off := range []int64{11, 12, 15, 19} {
		m.complete(off)
	}
	if m.base != 10 {
		t.Fatalf("base %d, want 10 (offset 10 not done)", m.base)
	}
	meta := m.metadata(map[int64]mark{13: {n: 2}}, MaxMetadataBytesDefault)
	m.complete(10)
	if m.base != 13 {
		t.Fatalf("base %d after completing 10, want 13", m.base)
	}
	// A new owner of the partition restores the earlier commit (base 10).
	r := newOffsetMap(10, meta)
	var got []int64
	for off := int64(10); off < 20; off++ {
		skip, att := r.add(off, &delivery{})
		if !skip {
			got = append(got, off)
		}
		if want := map[int64]int{13: 2}[off]; att.n != want {
			t.Errorf("offset %d restored with %d attempts, want %d", off, att, want)
		}
	}
	if want := []int64{10, 13, 14, 16, 17, 18}; !slices.Equal(got, want) {
		t.Fatalf("redelivered %v, want %v (meta %q)", got, want, meta)
	}
}

// TestOffsetMapRandom: under random completion orders and gaps, base is
// always the lowest incomplete offset, runs match the map, and a restore
// from the metadata redelivers exactly the incomplete records.
func TestOffsetMapRandom(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 1))
		m := newOffsetMap(-1, "")
		var offs []int64
		off := int64(rng.IntN(100))
		for range 1 + rng.IntN(300) {
			off += 1 + int64(rng.IntN(3)) // gaps: transaction markers, compaction
			offs = append(offs, off)
			m.add(off, &delivery{})
		}
		done := map[int64]bool{}
		for _, i := range rng.Perm(len(offs))[:rng.IntN(len(offs)+1)] {
			m.complete(offs[i])
			done[offs[i]] = true
		}
		wantBase := offs[len(offs)-1] + 1
		for _, o := range offs {
			if !done[o] {
				wantBase = o
				break
			}
		}
		if m.base != wantBase {
			t.Fatalf("seed %d: base %d, want %d", seed, m.base, wantBase)
		}
		runs := 0
		l := m.live()
		for i, e := range l {
			if e.done && (i == 0 || !l[i-1].done) {
				runs++
			}
		}
		if runs != m.runs {
			t.Fatalf("seed %d: runs %d, counted %d", seed, m.runs, runs)
		}
		meta := m.metadata(nil, MaxMetadataBytesDefault)
		if len(meta) > MaxMetadataBytesDefault {
			t.Fatalf("seed %d: metadata of %d bytes", seed, len(meta))
		}
		// A new owner restores base and metadata: it skips exactly the
		// done records (the metadata has room for all of them here).
		r := newOffsetMap(m.base, meta)
		for _, o := range offs {
			skip, _ := r.add(o, &delivery{})
			if o >= m.base && skip != done[o] {
				t.Fatalf("seed %d: offset %d: skipped %v, done %v (metadata %d bytes)", seed, o, skip, done[o], len(meta))
			}
		}
	}
}

// TestMetadataBounded: the metadata never exceeds its bound; what does not
// fit is redelivered, never skipped.
func TestMetadataBounded(t *testing.T) {
	m := newOffsetMap(0, "")
	for off := range int64(20000) {
		m.add(off, &delivery{})
	}
	for off := int64(1); off < 20000; off += 2 {
		m.complete(off)
	}
	meta := m.metadata(nil, 600)
	if len(meta) > 600 {
		t.Fatalf("metadata %d bytes, bound 600", len(meta))
	}
	done, _, _ := decodeMeta(0, meta)
	if len(done) == 0 {
		t.Fatal("nothing carried")
	}
	for off := range done {
		if off%2 == 0 {
			t.Fatalf("offset %d carried as done, was not", off)
		}
	}
}

// TestDecodeForeignMetadata: metadata not written by the driver (franz-go
// writes the member ID) means nothing done above the committed offset.
func TestDecodeForeignMetadata(t *testing.T) {
	for _, meta := range []string{"", "member-1-abc", "ko1.!!!", "ko1.AAAA", "ko1." + strings.Repeat("_", 40), "ko2.!!!", "ko2.AAAA", "ko3.AAAA"} {
		done, att, _ := decodeMeta(5, meta)
		if len(done) != 0 || len(att) != 0 {
			t.Errorf("%q: decoded %v %v, want nothing", meta, done, att)
		}
	}
}

// TestMetadataWithinLimit: with many attempt counts (due times too) and
// many done runs, the metadata stays within every bound from
// MetadataBytesMin up, carries the attempts of the lowest offsets first
// (at least one at the minimum), and what it carries is true: done offsets
// were done, attempt counts and due times are the ones given.
func TestMetadataWithinLimit(t *testing.T) {
	m := newOffsetMap(0, "")
	for off := range int64(2000) {
		m.add(off, &delivery{})
	}
	extra := map[int64]mark{}
	for off := int64(0); off < 2000; off++ {
		switch {
		case off%3 == 1:
			m.complete(off)
		case off%30 == 0:
			extra[off] = mark{n: 1 + int(off%7), due: 1_780_000_000_000 + off}
		}
	}
	for limit := MetadataBytesMin; limit <= 1200; limit += 7 {
		meta := m.metadata(extra, limit)
		if len(meta) > limit {
			t.Fatalf("limit %d: metadata of %d bytes", limit, len(meta))
		}
		done, att, due, err := parseMeta(0, meta)
		if err != nil {
			t.Fatalf("limit %d: %q does not decode: %v", limit, meta, err)
		}
		if len(att) == 0 {
			t.Fatalf("limit %d: no attempt count carried", limit)
		}
		for off := range done {
			if off%3 != 1 {
				t.Fatalf("limit %d: offset %d carried as done, was not", limit, off)
			}
		}
		for off, n := range att {
			if want := extra[off]; n != want.n || due[off] != want.due {
				t.Fatalf("limit %d: offset %d carried %d attempts due %d, want %+v", limit, off, n, due[off], want)
			}
		}
		// The lowest offsets first: every attempted offset below the
		// highest carried one is carried.
		var hi int64
		for off := range att {
			hi = max(hi, off)
		}
		for off := range extra {
			if _, ok := att[off]; off < hi && !ok {
				t.Fatalf("limit %d: offset %d left out below %d", limit, off, hi)
			}
		}
	}
}

// TestMetadataLimitValidated: a MaxMetadataBytes below MetadataBytesMin
// (or negative) fails the open with a *MetadataLimitError matching
// keyorder.ErrInvalidConfig, before any broker is asked; zero means the
// default and the minimum itself is accepted.
func TestMetadataLimitValidated(t *testing.T) {
	for _, n := range []int{-1, 1, 11, 12, MetadataBytesMin - 1} {
		_, err := openSubscription(context.Background(), "t", "g", &SubscriptionOptions{MaxMetadataBytes: n})
		var le *MetadataLimitError
		if !errors.As(err, &le) || le.Got != n || !errors.Is(err, keyorder.ErrInvalidConfig) {
			t.Errorf("MaxMetadataBytes %d: err %v, want a *MetadataLimitError matching ErrInvalidConfig", n, err)
		}
	}
	for _, n := range []int{0, MetadataBytesMin, MaxMetadataBytesDefault} {
		if err := (&SubscriptionOptions{MaxMetadataBytes: n}).validate(); err != nil {
			t.Errorf("MaxMetadataBytes %d: %v", n, err)
		}
	}
}
