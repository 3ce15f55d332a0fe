package main

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/keyorder/keyorder/internal/testenv"
)

// A compacting PostgreSQL subscription (compact=true): stats shows what was
// superseded, and tail receives only the newest message of the key.
func TestPostgresCompaction(t *testing.T) {
	base := testenv.Require(t, testenv.Postgres)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("topic", fmt.Sprintf("cli-compact-%d", time.Now().UnixNano()))
	q.Set("migrate", "true")
	q.Set("create", "true")
	q.Set("schema", "keyorder_cli")
	u.RawQuery = q.Encode()
	topicURL := u.String()
	q.Set("subscription", "latest")
	q.Set("ordering", "exclusive")
	q.Set("compact", "true")
	u.RawQuery = q.Encode()
	subURL := u.String()
	// Create the subscription before publishing: it sees only what follows.
	if code, stdout, stderr := cmd(t, "", "stats", subURL, "--json"); code != exitOK {
		t.Fatalf("stats: exit %d\n%s%s", code, stdout, stderr)
	}
	for _, v := range []string{"v1", "v2", "v3"} {
		if code, _, stderr := cmd(t, v, "publish", topicURL, "--key", "device-7"); code != exitOK {
			t.Fatal(stderr)
		}
	}
	code, stdout, stderr := cmd(t, "", "tail", subURL, "--count", "1", "--for", "60s", "--json")
	var got tailJSON
	if code != exitOK || json.Unmarshal([]byte(strings.TrimSpace(stdout)), &got) != nil || got.Payload != "v3" {
		t.Fatalf("tail: exit %d, want v3\n%s%s", code, stdout, stderr)
	}
	if st := statsOf(t, subURL); !is(st.Superseded, 2) || !is(st.Pending, 0) || !is(st.Dead, 0) {
		t.Errorf("stats --json after compaction: superseded %s, pending %s, dead %s", show(st.Superseded), show(st.Pending), show(st.Dead))
	}
	code, stdout, _ = cmd(t, "", "stats", subURL)
	if code != exitOK || !strings.Contains(stdout, "superseded") || !strings.Contains(stdout, "2 (compaction") {
		t.Errorf("stats: exit %d, lacks the superseded row\n%s", code, stdout)
	}
	// Ordered refuses compaction.
	q.Set("subscription", "ordered-latest")
	q.Set("ordering", "ordered")
	u.RawQuery = q.Encode()
	if code, _, stderr := cmd(t, "", "stats", u.String()); code == exitOK || !strings.Contains(stderr, "Compaction") {
		t.Errorf("an Ordered compacting subscription: exit %d, stderr %q", code, stderr)
	}
}
