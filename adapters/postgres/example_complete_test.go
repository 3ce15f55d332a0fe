package postgres_test

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/subscribe"
)

// Exactly-once effects: the balance update and the message's
// acknowledgement commit in one transaction (HandleTx), so a crash or a
// redelivery never applies an adjustment twice, with no idempotency
// table. Compile-only: it needs a server.
func ExampleHandleTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app:secret@db:5432/app?sslmode=require&pool_max_conns=16")
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	sub, err := postgres.OpenSubscription(ctx, pool, "ledger", "apply-balance", nil, &subscribe.Config{Workers: 8})
	if err != nil {
		panic(err)
	}
	defer sub.Close(context.Background())

	err = sub.Run(ctx, postgres.HandleTx(pool, func(ctx context.Context, tx pgx.Tx, d *keyorder.Delivery) error {
		var adj struct{ Delta int64 }
		if err := json.Unmarshal(d.Payload, &adj); err != nil {
			return keyorder.Permanent(err)
		}
		_, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance + $1 WHERE id = $2", adj.Delta, d.Key)
		return err // nil: HandleTx completes d in tx and commits both
	}))
	if err != nil {
		panic(err)
	}
}
