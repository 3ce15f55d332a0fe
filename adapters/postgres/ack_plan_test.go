package postgres_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// TestAckPlanLooksUpIDs plans the acknowledging statement as a consumer
// sends it (1,000 ids, a custom plan) over a 50,000-message backlog with
// fresh statistics, and requires that it finds the acked deliveries and
// bodies by key lookups: no scan of the subscription's deliveries or of
// the messages table. Given the ids as a literal array the planner chose
// such scans (and a nested loop of every message against the acked rows,
// seconds per ack). Then it runs the ack and checks that exactly those
// deliveries and bodies are gone.
func TestAckPlanLooksUpIDs(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t, 2*time.Minute)
	tp := e.topic("plan", nil)
	e.sub("plan", "s", policy.Ordered, nil)
	const n, keys, acked = 50_000, 1_000, 1_000
	payload := make([]byte, 100)
	for i := 0; i < n; {
		batch := make([]*driver.Message, 0, 1000)
		for ; i < n && len(batch) < cap(batch); i++ {
			batch = append(batch, &driver.Message{ID: strconv.Itoa(i), Key: "key-" + strconv.Itoa(i%keys), Payload: payload})
		}
		sendBatch(t, tp, batch...)
	}
	q := pgx.Identifier{e.schema}.Sanitize()
	if _, err := e.pool.Exec(ctx, fmt.Sprintf("ANALYZE %s.deliveries, %s.messages", q, q)); err != nil {
		t.Fatal(err)
	}
	var subID, topicID int32
	if err := e.pool.QueryRow(ctx, fmt.Sprintf("SELECT id, topic_id FROM %s.subscriptions", q)).Scan(&subID, &topicID); err != nil {
		t.Fatal(err)
	}
	var ids []int64
	if err := e.pool.QueryRow(ctx, fmt.Sprintf(
		"SELECT array_agg(id) FROM (SELECT id FROM %s.deliveries ORDER BY id LIMIT %d) x", q, acked)).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	ack := postgres.Expand(postgres.SQLAck, e.schema)

	var plan []byte
	// QueryExecModeExec: an unnamed statement, planned with the ids.
	if err := e.pool.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+ack, pgx.QueryExecModeExec, subID, ids, topicID).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	var root []struct{ Plan planNode }
	if err := json.Unmarshal(plan, &root); err != nil {
		t.Fatal(err)
	}
	var bad []string
	root[0].Plan.walk(func(p planNode) {
		switch {
		case p.Type == "Seq Scan" && (p.Relation == "deliveries" || p.Relation == "messages"):
			bad = append(bad, p.Type+" on "+p.Relation)
		case p.Index == "deliveries_pkey" || p.Index == "messages_pkey":
			if !strings.Contains(p.IndexCond, "(id = ") { // not "(sub_id = "
				bad = append(bad, p.Type+" on "+p.Index+" with "+p.IndexCond)
			}
		}
	})
	if len(bad) > 0 {
		t.Errorf("the ack of %d ids scans more than their rows: %v\n%s", acked, bad, plan)
	}

	if _, err := e.pool.Exec(ctx, ack, subID, ids, topicID); err != nil {
		t.Fatal(err)
	}
	var left, bodies, gone int
	if err := e.pool.QueryRow(ctx, fmt.Sprintf(`SELECT
		(SELECT count(*) FROM %[1]s.deliveries),
		(SELECT count(*) FROM %[1]s.messages),
		(SELECT count(*) FROM %[1]s.deliveries WHERE id = ANY($1)) + (SELECT count(*) FROM %[1]s.messages WHERE id = ANY($1))`, q),
		ids).Scan(&left, &bodies, &gone); err != nil {
		t.Fatal(err)
	}
	if left != n-acked || bodies != n-acked || gone != 0 {
		t.Errorf("after acking %d of %d: %d deliveries and %d bodies left, %d of the acked still there", acked, n, left, bodies, gone)
	}
}

// planNode is a node of EXPLAIN (FORMAT JSON).
type planNode struct {
	Type      string     `json:"Node Type"`
	Relation  string     `json:"Relation Name"`
	Index     string     `json:"Index Name"`
	IndexCond string     `json:"Index Cond"`
	Plans     []planNode `json:"Plans"`
}

func (p planNode) walk(f func(planNode)) {
	f(p)
	for _, c := range p.Plans {
		c.walk(f)
	}
}
