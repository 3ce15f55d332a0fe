package postgres

// This file: completing a delivery in the application's own transaction
// (CompleteTx, HandleTx), River's JobCompleteTx for ordered messages.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/subscribe"
)

var (
	// ErrLeaseLost: the lease of a delivery was lost (it expired and
	// another consumer claimed the message, which may be running it now),
	// so this consumer may not settle it. CompleteTx refuses the
	// completion inside the transaction, which must then roll back, taking
	// the handler's effects with it; the subscriber settles nothing, and the
	// message runs again where it was claimed, its attempt counted. The
	// driver's Ack and DeadLetter leave such a delivery to the consumer that
	// claimed it and answer with this error (the subscriber logs it).
	ErrLeaseLost = errors.New("keyorder postgres: lease lost: another consumer claimed the message and may be running it; not settled")
	// ErrNotRunning: CompleteTx was given a delivery that is not running
	// in a handler of a PostgreSQL subscription with the given context
	// (another context, a delivery of another backend, or a handler that
	// has returned), or one that was settled already (completed twice).
	ErrNotRunning = errors.New("keyorder postgres: not a running delivery of this subscription")
)

// CompleteTx acknowledges d inside tx: the delivery is deleted exactly
// when tx commits, together with whatever else tx wrote, and stays
// pending if tx rolls back. It turns at-least-once delivery into
// exactly-once effects for handlers whose effects are writes to the same
// database: a crash before the commit leaves neither the effects nor the
// completion, a crash after it leaves both, and a redelivery never finds
// the message again.
//
// ctx must be the handler's context (or derived from it) and d the
// delivery the handler was given; call it before the handler returns, as
// the last statement of tx, and return its error. HandleTx does all of
// that and is the easier way.
//
// The completion is guarded by the lease: if the lease was lost (another
// consumer claimed the message), CompleteTx fails with ErrLeaseLost and
// tx must roll back; the subscriber then settles nothing, whatever the
// handler returns. From a successful CompleteTx until tx ends no other
// consumer can claim the message's key (or the keyless message). Until tx
// ends the key's head row is locked (FOR KEY SHARE): publishers of the key
// are not held up, but the key's release and its lease renewal's
// bookkeeping wait, so keep the transaction short.
//
// If tx commits, the subscriber's own acknowledgement finds the delivery
// gone and only releases the key. A handler that returns an error after
// CompleteTx, or whose tx rolls back, fails as any handler does: the
// message is retried (attempt counted) or dead-lettered.
func CompleteTx(ctx context.Context, tx pgx.Tx, d *keyorder.Delivery) error {
	_, err := completeTx(ctx, tx, []*keyorder.Delivery{d})
	return err
}

// CompleteBatchTx acknowledges ds inside tx, all of them or none, as
// CompleteTx acknowledges one: for a RunBatch handler, with the deliveries
// it was given. If any member's lease was lost, none is completed and the
// error is ErrLeaseLost.
func CompleteBatchTx(ctx context.Context, tx pgx.Tx, ds []*keyorder.Delivery) error {
	_, err := completeTx(ctx, tx, ds)
	return err
}

func completeTx(ctx context.Context, tx pgx.Tx, ds []*keyorder.Delivery) ([]*ackID, error) {
	if tx == nil {
		return nil, fmt.Errorf("%w: postgres: CompleteTx: nil transaction", keyorder.ErrInvalidConfig)
	}
	if len(ds) == 0 {
		return nil, nil
	}
	at := driver.AttemptOf(ctx)
	if at == nil {
		return nil, fmt.Errorf("%w: the context is not a handler's", ErrNotRunning)
	}
	ms := make([]*driver.Message, len(ds))
	as := make([]*ackID, len(ds))
	ids := make([]int64, len(ds))
	keys := make([]string, len(ds))
	tokens := make([]int64, len(ds))
	direct := make([]bool, len(ds))
	var su *pgSubscription
	for i, d := range ds {
		m := at.Message(d)
		if m == nil {
			id := ""
			if d != nil {
				id = d.ID
			}
			return nil, fmt.Errorf("%w: message %q is not a delivery of this handler attempt", ErrNotRunning, id)
		}
		a, ok := m.AckID.(*ackID)
		if !ok || a.su == nil {
			return nil, fmt.Errorf("%w: message %q was not delivered by a PostgreSQL subscription", ErrNotRunning, m.ID)
		}
		if su == nil {
			su = a.su
		} else if su != a.su {
			return nil, fmt.Errorf("%w: postgres: CompleteBatchTx: deliveries of several subscriptions", keyorder.ErrInvalidConfig)
		}
		ms[i], as[i] = m, a
		ids[i], tokens[i], direct[i] = a.id, a.token, a.chain == nil
		if a.chain != nil {
			keys[i], tokens[i] = a.chain.key, a.chain.token
		}
	}
	var passed, deleted int
	err := tx.QueryRow(ctx, su.s.sql(sqlComplete), su.info.id, ids, keys, tokens, direct, su.info.topicID).Scan(&passed, &deleted)
	switch {
	case err != nil:
		return nil, fmt.Errorf("postgres: complete: %w", err)
	case passed < len(ds):
		at.LeaseLost(ms)
		return nil, fmt.Errorf("%w: %d of %d messages (first %q)", ErrLeaseLost, len(ds)-passed, len(ds), ms[0].ID)
	case deleted < len(ds):
		// The lease is ours but a delivery is gone: completed already in
		// this transaction, or settled before.
		return nil, fmt.Errorf("%w: %d of %d messages were settled already (first %q)", ErrNotRunning, len(ds)-deleted, len(ds), ms[0].ID)
	}
	return as, nil
}

// TxBeginner begins a transaction: *pgxpool.Pool and *pgx.Conn are
// TxBeginners (and so is a pgx.Tx, whose Begin makes a savepoint).
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// TxHandlerFunc handles a delivery inside tx (see HandleTx). It must not
// commit or roll back tx.
type TxHandlerFunc func(ctx context.Context, tx pgx.Tx, d *keyorder.Delivery) error

// TxBatchHandlerFunc handles a RunBatch batch inside tx (see
// HandleBatchTx). It must not commit or roll back tx.
type TxBatchHandlerFunc func(ctx context.Context, tx pgx.Tx, ds []*keyorder.Delivery) error

// HandleTx returns a handler for subscribe.Subscriber.Run that runs h in a
// transaction of its own on db and completes the delivery in it
// (CompleteTx): h's writes and the acknowledgement commit together or not
// at all. If h returns an error, panics, or the completion or the commit
// fails, the transaction rolls back and the error (a panic is re-raised)
// goes to the subscriber as any handler's: retry with the attempt counted,
// or dead letter. A completion refused because the lease was lost
// (ErrLeaseLost) is settled by nobody here: the consumer that claimed the
// message runs it. The key stays held from the claim until the
// transaction has ended.
//
// Each running handler holds one connection of db for its transaction:
// give the pool more connections than the subscriber has workers, since
// the subscriber's claims and acknowledgements need some too.
func HandleTx(db TxBeginner, h TxHandlerFunc) subscribe.HandlerFunc {
	return func(ctx context.Context, d *keyorder.Delivery) error {
		return inTx(ctx, db, []*keyorder.Delivery{d}, func(tx pgx.Tx) error { return h(ctx, tx, d) })
	}
}

// HandleBatchTx is HandleTx for subscribe.Subscriber.RunBatch: h handles
// the whole batch in one transaction, and every member completes in it, or
// none does. A failure fails the batch at its first member (return a
// keyorder.BatchError from h to fail at a later one: the transaction
// still rolls back, and the members before the index are acknowledged
// without their effects, so don't).
func HandleBatchTx(db TxBeginner, h TxBatchHandlerFunc) subscribe.BatchHandlerFunc {
	return func(ctx context.Context, ds []*keyorder.Delivery) error {
		return inTx(ctx, db, ds, func(tx pgx.Tx) error { return h(ctx, tx, ds) })
	}
}

// rollbackTimeout bounds the rollback after a failed or panicking handler,
// which runs even when the handler's context was cancelled.
const rollbackTimeout = 10 * time.Second

func inTx(ctx context.Context, db TxBeginner, ds []*keyorder.Delivery, h func(tx pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("postgres: begin: %w", err)
	}
	done := false
	defer func() {
		if !done { // an error, or a panic on its way up
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
			defer cancel()
			_ = tx.Rollback(rctx)
		}
	}()
	if err := h(tx); err != nil {
		return err
	}
	as, err := completeTx(ctx, tx, ds)
	if err != nil {
		return err
	}
	done = true // a failed Commit has ended the transaction too
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("postgres: commit: %w", err)
	}
	for _, a := range as {
		a.committed.Store(true)
	}
	return nil
}
