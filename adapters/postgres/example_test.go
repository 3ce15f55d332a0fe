package postgres_test

import (
	"context"

	"github.com/keyorder/keyorder"
	_ "github.com/keyorder/keyorder/adapters/postgres" // registers postgres:// and postgresql://
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// The same program on PostgreSQL, chosen by URL: the topic and the
// subscription (a consumer group with its own policy and retry budget) live
// in tables of the schema keyorder. Compile-only: it needs a server. The
// password goes in the userinfo (errors show it redacted), never in a query
// parameter; pgx's connection parameters (sslmode, pool_max_conns, ...)
// pass through.
func Example() {
	ctx := context.Background()

	// The subscription first: it receives only what is published after it
	// exists. create=true creates the topic and
	// the subscription (with ordering and max_attempts) when missing;
	// migrate=true applies the schema's migrations first.
	sub, err := subscribe.Open(ctx,
		"postgres://app:secret@db:5432/app?sslmode=require&topic=ledger&subscription=apply-balance&ordering=ordered&max_attempts=10&create=true&migrate=true",
		&subscribe.Config{Workers: 8})
	if err != nil {
		panic(err)
	}
	defer sub.Close()

	pub, err := publish.Open(ctx, "postgres://app:secret@db:5432/app?sslmode=require&topic=ledger", nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close(ctx)
	_, err = pub.Publish(ctx, &keyorder.Message{Key: "acct-42", Payload: []byte(`{"delta":-500}`)})
	if err != nil {
		panic(err)
	}

	err = sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
		return nil // apply d.Payload to account d.Key
	})
	if err != nil {
		panic(err)
	}
}
