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

// TestArrayPlansLookUpKeys plans every statement that takes an array of
// keys or ids (1,000 of them, as a consumer or Admin sends them) over a
// 50,000-message backlog of 5,000 keys, and requires that it finds its
// heads, deliveries, bodies and dead letters by key lookups: no sequential
// scan of those tables, and no index scan that reads a whole subscription
// (an index condition on sub_id alone). It plans each one four ways: before
// the tables have statistics and after ANALYZE, each with a custom plan
// (the values known: a prepared statement's first executions, an unnamed
// statement's every one) and a generic plan. Given the arrays themselves
// the planner hashed every head (or delivery, or dead letter) of the
// subscription and joined it with them; the ack, given its ids, scanned
// the subscription's deliveries and, with fresh statistics, nested-looped
// every message against the acked rows (seconds per ack). Then it runs
// each statement with every other token wrong and checks the rows it
// touched, so that hiding the arrays from the planner still pairs each key
// or id with its token, and runs the ack and checks that it deleted
// exactly the acked deliveries and the bodies no other subscription holds.
func TestArrayPlansLookUpKeys(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t, 3*time.Minute)
	tp := e.topic("plan", nil)
	e.sub("plan", "o", policy.Ordered, nil)
	e.sub("plan", "x", policy.Exclusive, nil)
	e.sub("plan", "p", policy.Parallel, nil)
	q := pgx.Identifier{e.schema}.Sanitize()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := e.pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%v\n%s", err, sql)
		}
	}
	// No statistics until the second round: autovacuum must not analyze
	// the tables behind the test's back.
	for _, tb := range []string{"messages", "deliveries", "heads", "dead_letters"} {
		exec(fmt.Sprintf("ALTER TABLE %s.%s SET (autovacuum_enabled = false)", q, tb))
	}
	const n, keys, k = 50_000, 5_000, 1_000
	payload := make([]byte, 100)
	for i := 0; i < n; {
		batch := make([]*driver.Message, 0, 1000)
		for ; i < n && len(batch) < cap(batch); i++ {
			batch = append(batch, &driver.Message{ID: strconv.Itoa(i), Key: "key-" + strconv.Itoa(i%keys), Payload: payload})
		}
		sendBatch(t, tp, batch...)
	}
	var topicID int32
	subs := map[string]int32{}
	rows, err := e.pool.Query(ctx, fmt.Sprintf("SELECT id, topic_id, name FROM %s.subscriptions", q))
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int32
		var name string
		if err := rows.Scan(&id, &topicID, &name); err != nil {
			t.Fatal(err)
		}
		subs[name] = id
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	// 1,000 of the keys and 1,000 of the Parallel subscription's
	// deliveries are leased (token 7); every message of the Ordered
	// subscription is also a dead letter.
	var ks, msgIDs []string
	for i := range k {
		ks = append(ks, "key-"+strconv.Itoa(i*(keys/k)))
		msgIDs = append(msgIDs, strconv.Itoa(i*(n/k)))
	}
	var ids []int64
	if err := e.pool.QueryRow(ctx, fmt.Sprintf(`SELECT array_agg(id ORDER BY id) FROM (
		SELECT id, row_number() OVER (ORDER BY id) AS rn FROM %s.deliveries WHERE sub_id = $1) x WHERE rn %% $2 = 0`, q),
		subs["p"], n/k).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	if len(ids) != k {
		t.Fatalf("%d ids, want %d", len(ids), k)
	}
	exec(fmt.Sprintf("UPDATE %s.heads SET lease_token = 7, chain_end = 1 << 40 WHERE msg_key = ANY($1)", q), ks)
	exec(fmt.Sprintf("UPDATE %s.deliveries SET lease_token = 7 WHERE sub_id = $1 AND id = ANY($2)", q), subs["p"], ids)
	exec(fmt.Sprintf(`INSERT INTO %[1]s.dead_letters (sub_id, id, msg_id, msg_key, payload, published_at, reason, attempts)
		SELECT $1, id, msg_id, msg_key, payload, published_at, 'test', 1 FROM %[1]s.messages`, q), subs["o"])
	// Every other token is wrong: those keys and ids must match nothing.
	tokens := make([]int64, k)
	for i := range tokens {
		tokens[i] = 7 + int64(i%2)
	}
	lease := 30 * time.Second
	// The acks' other arrays: the keys of the acked messages (for the
	// Ordered subscription, whose deliveries are keyed) and the tokens of
	// the Parallel one's (direct) deliveries.
	var idKeys []string
	if err := e.pool.QueryRow(ctx, fmt.Sprintf("SELECT array_agg(msg_key ORDER BY id) FROM %s.messages WHERE id = ANY($1)", q), ids).Scan(&idKeys); err != nil {
		t.Fatal(err)
	}
	sevens := make([]int64, k)
	for i := range k {
		sevens[i] = 7
	}

	statements := []struct {
		name string
		sql  string
		args []any
		rows int64 // rows the statement touches; -1: checked elsewhere
	}{
		{"Ack", postgres.SQLAck, []any{subs["p"], ids, topicID, sevens}, -1}, // run below
		{"AckKeyed", postgres.SQLAckKeyed, []any{subs["o"], ids, topicID, idKeys, tokens}, -1},
		{"LockRelease", postgres.SQLLockRelease, []any{subs["o"], ks}, k},
		{"Release/Ordered", postgres.SQLRelease(false), []any{subs["o"], ks, tokens}, k / 2},
		{"Release/Exclusive", postgres.SQLRelease(true), []any{subs["x"], ks, tokens}, k / 2},
		{"DropIdleHeads", postgres.SQLDropIdleHeads, []any{subs["o"], ks}, 0},
		{"ReleaseDirect", postgres.SQLReleaseDirect, []any{subs["p"], ids, tokens}, k / 2},
		{"ExtendKeys", postgres.SQLExtendKeys, []any{subs["o"], ks, tokens, lease}, k / 2},
		{"ExtendDirect", postgres.SQLExtendDirect, []any{subs["p"], ids, tokens, lease}, k / 2},
		{"Started", postgres.SQLStarted, []any{subs["o"], ks, tokens, ids}, k / 2},
		{"Redrive", postgres.SQLRedrive, []any{subs["o"], msgIDs}, k},
	}
	for _, stats := range []bool{false, true} {
		if stats {
			exec(fmt.Sprintf("ANALYZE %[1]s.messages, %[1]s.deliveries, %[1]s.heads, %[1]s.dead_letters", q))
		}
		for _, tc := range statements {
			for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
				plan := explainJSON(t, e, postgres.Expand(tc.sql, e.schema), mode, tc.args)
				if bad := wholeScans(plan); len(bad) > 0 {
					t.Errorf("%s (statistics %v, %s) reads more than its %d keys: %v\n%s", tc.name, stats, mode, k, bad, plan)
				}
			}
		}
	}
	for _, tc := range statements {
		if tc.rows < 0 {
			continue
		}
		sql := postgres.Expand(tc.sql, e.schema)
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tag, err := tx.Exec(ctx, sql, tc.args...)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
		} else if tag.RowsAffected() != tc.rows {
			t.Errorf("%s touched %d rows, want %d", tc.name, tag.RowsAffected(), tc.rows)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// The ack of the Parallel subscription's 1,000 deliveries, after the
	// other two subscriptions acked the first half of those messages: it
	// deletes the 1,000 deliveries and the 500 bodies nobody else holds.
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, fmt.Sprintf("DELETE FROM %s.deliveries WHERE sub_id = ANY($1) AND id = ANY($2)", q),
		[]int32{subs["o"], subs["x"]}, ids[:k/2]); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, postgres.Expand(postgres.SQLAck, e.schema), subs["p"], ids, topicID, sevens); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	var deliveries, bodies, ackedLeft, kept, held int
	if err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT
		(SELECT count(*) FROM %[1]s.deliveries),
		(SELECT count(*) FROM %[1]s.messages),
		(SELECT count(*) FROM %[1]s.deliveries WHERE sub_id = $1 AND id = ANY($2)),
		(SELECT count(*) FROM %[1]s.messages WHERE id = ANY($2)),
		(SELECT count(*) FROM %[1]s.messages WHERE id = ANY($3))`, q),
		subs["p"], ids, ids[k/2:]).Scan(&deliveries, &bodies, &ackedLeft, &kept, &held); err != nil {
		t.Fatal(err)
	}
	if deliveries != 3*n-2*k || bodies != n-k/2 || ackedLeft != 0 || kept != k/2 || held != k/2 {
		t.Errorf("after the ack of %d deliveries, %d of them acked elsewhere: %d deliveries (want %d) and %d bodies (want %d) left; "+
			"%d of the acked deliveries and %d of their bodies still there (want 0 and %d), %d of those held elsewhere (want %d)",
			k, k/2, deliveries, 3*n-2*k, bodies, n-k/2, ackedLeft, kept, k/2, held, k/2)
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

// explainJSON returns the plan of sql under plan_cache_mode mode, as a
// prepared statement planned with args.
func explainJSON(t *testing.T, e *env, sql, mode string, args []any) []byte {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = "+mode); err != nil {
		t.Fatal(err)
	}
	// A named statement: plan_cache_mode decides how it is planned.
	const name = "keyorder_plan_test"
	if _, err := tx.Conn().Prepare(ctx, name, "EXPLAIN (FORMAT JSON) "+sql); err != nil {
		t.Fatal(err)
	}
	defer tx.Conn().Deallocate(ctx, name)
	var plan []byte
	if err := tx.QueryRow(ctx, name, args...).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	return plan
}

// wholeScans lists the nodes of an EXPLAIN (FORMAT JSON) plan that read a
// table of messages, deliveries, heads or dead letters other than by key:
// sequential scans, and index scans without a condition on the id, key or
// claimable_at column (sub_id alone reads a whole subscription).
func wholeScans(plan []byte) []string {
	var root []struct{ Plan planNode }
	if err := json.Unmarshal(plan, &root); err != nil {
		return []string{err.Error()}
	}
	var bad []string
	root[0].Plan.walk(func(p planNode) {
		switch p.Relation {
		case "messages", "deliveries", "heads", "dead_letters":
			if p.Type == "Seq Scan" {
				bad = append(bad, p.Type+" on "+p.Relation)
			}
		}
		if !strings.HasPrefix(p.Index, "messages_") && !strings.HasPrefix(p.Index, "deliveries_") &&
			!strings.HasPrefix(p.Index, "heads_") && !strings.HasPrefix(p.Index, "dead_letters_") {
			return
		}
		for _, c := range []string{"(id = ", "(msg_key = ", "(msg_id = ", "(claimable_at = "} {
			if strings.Contains(p.IndexCond, c) {
				return
			}
		}
		bad = append(bad, p.Type+" on "+p.Index+" with "+p.IndexCond)
	})
	return bad
}
