package main

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
)

func quietLogger() *slog.Logger {
	return slog.New(slog.DiscardHandler)
}

// benchWatermill publishes c.n messages with the default PostgreSQL schema
// (one Publish call per batch), then consumes them with one subscriber,
// acking each.
func benchWatermill(ctx context.Context, pool *pgxpool.Pool, c config) (pub, con float64, err error) {
	topic := fmt.Sprintf("wmbench_%d", time.Now().UnixNano()%1e9)
	db := sql.BeginnerFromPgx(pool)
	schema := sql.DefaultPostgreSQLSchema{}
	offsets := sql.DefaultPostgreSQLOffsetsAdapter{}
	defer func() {
		_, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS "watermill_`+topic+`", "watermill_offsets_`+topic+`"`)
	}()
	publisher, err := sql.NewPublisher(db, sql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, watermill.NopLogger{})
	if err != nil {
		return 0, 0, err
	}
	subscriber, err := sql.NewSubscriber(db, sql.SubscriberConfig{
		SchemaAdapter:    schema,
		OffsetsAdapter:   offsets,
		InitializeSchema: true,
		PollInterval:     time.Millisecond,
	}, watermill.NopLogger{})
	if err != nil {
		return 0, 0, err
	}
	defer subscriber.Close()
	if err := subscriber.SubscribeInitialize(topic); err != nil {
		return 0, 0, err
	}
	// The default schema stores the payload as JSON: a JSON string of
	// c.size bytes.
	payload := []byte(`"` + strings.Repeat("x", c.size-2) + `"`)
	cpu := c.srv.start()
	start := time.Now()
	for i := 0; i < c.n; i += c.batch {
		var ms []*message.Message
		for j := i; j < min(i+c.batch, c.n); j++ {
			ms = append(ms, message.NewMessage(strconv.Itoa(j), payload))
		}
		if err := publisher.Publish(topic, ms...); err != nil {
			return 0, 0, err
		}
	}
	pub = float64(c.n) / time.Since(start).Seconds()
	cpu.report("watermill-sql", "publish (batched)", c.n)

	cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cpu = c.srv.start()
	start = time.Now()
	ch, err := subscriber.Subscribe(cctx, topic)
	if err != nil {
		return 0, 0, err
	}
	for got := 0; got < c.n; got++ {
		select {
		case m := <-ch:
			m.Ack()
		case <-cctx.Done():
			return 0, 0, fmt.Errorf("watermill: %d of %d consumed: %w", got, c.n, cctx.Err())
		}
	}
	con = float64(c.n) / time.Since(start).Seconds()
	cpu.report("watermill-sql", "consume", c.n)
	return pub, con, nil
}
