package postgres

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// The drivers, for this package's tests: they exercise the driver contract
// directly (Receive, Ack, ...), which applications reach only through
// publish and subscribe.

// Topic is the topic driver.
type Topic = pgTopic

// Subscription is the subscription driver.
type Subscription = pgSubscription

// SQLAck and SQLAckKeyed are the acknowledging statements (of direct and
// keyed deliveries), for plan tests; Expand puts the schema in.
const (
	SQLAck      = sqlAck
	SQLAckKeyed = sqlAckKeyed
)

// The other statements that take arrays of ids or keys, for plan tests.
const (
	SQLLockRelease   = sqlLockRelease
	SQLDropIdleHeads = sqlDropIdleHeads
	SQLReleaseDirect = sqlReleaseDirect
	SQLExtendKeys    = sqlExtendKeys
	SQLExtendDirect  = sqlExtendDirect
	SQLStarted       = sqlStarted
	SQLRedrive       = sqlRedrive
)

// SQLRelease is the releasing statement of an Ordered (exclusive false) or
// Exclusive subscription.
func SQLRelease(exclusive bool) string {
	next := nextOrdered
	if exclusive {
		next = nextExclusive
	}
	return strings.ReplaceAll(sqlRelease, "{{next}}", next)
}

// Expand replaces {{schema}} in a statement with the quoted schema name.
func Expand(sql, schema string) string { return expand(sql, pgx.Identifier{schema}.Sanitize()) }

// OpenTopicDriver opens the topic driver (see OpenTopic).
var OpenTopicDriver = openTopic

// OpenSubscriptionDriver opens the subscription driver (see
// OpenSubscription).
var OpenSubscriptionDriver = openSubscription

// WaitStarted waits until the started marks noted so far are written (or
// their write failed).
func (su *pgSubscription) WaitStarted() {
	st := &su.starts
	if st.wake == nil {
		return
	}
	st.mu.Lock()
	w := st.writing
	if len(st.pending) > 0 {
		w = st.cur
	}
	st.mu.Unlock()
	signal(st.urgent)
	if w != nil {
		<-w.done
	}
}
