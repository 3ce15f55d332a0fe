// Command probe fills a schema with a backlog for query-plan experiments.
package main

import (
	"context"
	"log"
	"os"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder/adapters"
	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/policy"
)

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("KEYORDER_PG_URL"))
	if err != nil {
		log.Fatal(err)
	}
	n, _ := strconv.Atoi(os.Args[2])
	keys, _ := strconv.Atoi(os.Args[3])
	schema := os.Args[1]
	if _, err := postgres.Migrate(ctx, pool, postgres.DirectionUp, &postgres.MigrateOptions{Schema: schema}); err != nil {
		log.Fatal(err)
	}
	o := &postgres.Options{Schema: schema, Create: true, Subscription: &postgres.SubscriptionOptions{Ordering: policy.Ordered}}
	tp, err := postgres.OpenTopic(ctx, pool, "t", o)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := postgres.OpenSubscription(ctx, pool, "t", "s", o); err != nil {
		log.Fatal(err)
	}
	for i := 0; i < n; {
		var b []*adapters.Message
		for ; i < n && len(b) < 1000; i++ {
			b = append(b, &adapters.Message{ID: strconv.Itoa(i), Key: "key-" + strconv.Itoa(i%keys), Payload: make([]byte, 100)})
		}
		if err := tp.SendBatch(ctx, b); err != nil {
			log.Fatal(err)
		}
	}
}
