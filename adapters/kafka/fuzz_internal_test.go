package kafka

import (
	"net/url"
	"testing"

	"github.com/keyorder/keyorder/internal/urlfuzz"
)

// FuzzURL holds kafka:// to the promises every scheme keeps (see
// internal/urlfuzz): no panic, no secret echoed, no parameter dropped.
func FuzzURL(f *testing.F) {
	urlfuzz.Seed(f, "group=g", "group=g&ordering=%zz", "group=g&group=h", "create=true&partitions=3", "group=g&lease=5s&max_pending=10", "client_id=%zz")
	f.Add(uint8(0), "", "", "b1:9092,b2:9092", "/orders", "group=g&ordering=ordered")
	f.Fuzz(func(t *testing.T, where uint8, user, secret, host, path, query string) {
		urlfuzz.Check(t, Scheme, where, user, secret, host, path, query, func(u *url.URL) error {
			_, err := parseURL(u, true)
			return err
		})
	})
}

// FuzzCommitMetadata feeds the commit-metadata decoder what another client
// (or a corrupted commit) could leave on a partition: it must not panic,
// must bound what it builds, and must never report an offset below the
// committed one as done or attempted (that would skip a record never
// handled).
func FuzzCommitMetadata(f *testing.F) {
	m := newOffsetMap(100, "")
	for off := int64(100); off < 120; off++ {
		m.add(off, nil)
	}
	for _, off := range []int64{102, 103, 107, 119} {
		m.complete(off)
	}
	f.Add(int64(100), m.metadata(map[int64]mark{101: {n: 2, due: 1_700_000_000_000}}, 4000))
	f.Add(int64(0), metaPrefix)
	f.Add(int64(5), metaPrefix1+"AAICAQE")
	f.Add(int64(5), metaPrefix+"AQICAAIB")
	f.Add(int64(0), "not ours")
	f.Fuzz(func(t *testing.T, base int64, meta string) {
		if base < 0 || base > 1<<50 {
			return
		}
		done, attempts, due, err := parseMeta(base, meta)
		if err != nil {
			return
		}
		if len(done) > 1<<22 || len(attempts) > maxAttemptEntries {
			t.Fatalf("decoded %d done and %d attempts from %d bytes", len(done), len(attempts), len(meta))
		}
		for off := range done {
			if off < base {
				t.Fatalf("done offset %d below the committed %d", off, base)
			}
		}
		for off := range due {
			if off < base || due[off] <= 0 {
				t.Fatalf("due time %d for offset %d (committed %d)", due[off], off, base)
			}
		}
		for off := range attempts {
			if off < base {
				t.Fatalf("attempts for offset %d below the committed %d", off, base)
			}
		}
	})
}
