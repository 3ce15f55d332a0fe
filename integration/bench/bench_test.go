package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keyorder/keyorder/internal/testenv"
)

// TestQuick runs the program's quick mode against every backend whose
// server is there (all of them under ./integration/test.sh and in CI), so
// the benchmark cannot rot: every system publishes, consumes and runs end
// to end, keyorder keeps per-key order, and the table and chart are
// written.
func TestQuick(t *testing.T) {
	servers := map[string]string{"postgres": testenv.Postgres, "pubsub": testenv.PubSub, "sqs": testenv.SQS, "pulsar": testenv.Pulsar}
	for _, name := range backends {
		t.Run(name, func(t *testing.T) {
			if s, ok := servers[name]; ok {
				testenv.Require(t, s)
			}
			o := options{size: 100, out: t.TempDir()}.quickened()
			var out strings.Builder
			rep, err := runBackend(context.Background(), name, o, &out)
			t.Log("\n" + out.String())
			if err != nil {
				t.Fatal(err)
			}
			if got, want := len(rep.results), len(rep.backend.systems); got != want {
				t.Fatalf("%d results, want one per system (%d)", got, want)
			}
			for _, r := range rep.results {
				if r.publish <= 0 || r.consume <= 0 || r.e2e <= 0 {
					t.Errorf("%s: publish %.0f, consume %.0f, end-to-end %.0f msgs/s: want all > 0", r.system, r.publish, r.consume, r.e2e)
				}
				if strings.HasPrefix(r.system, "keyorder") && r.violations != 0 {
					t.Errorf("%s: %d order violations, want 0", r.system, r.violations)
				}
			}
			for _, f := range []string{name + ".md", name + ".png"} {
				if st, err := os.Stat(filepath.Join(o.out, f)); err != nil || st.Size() == 0 {
					t.Errorf("%s not written: %v", f, err)
				}
			}
		})
	}
}
