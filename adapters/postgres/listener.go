package postgres

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// listener holds a connection outside the pool that LISTENs on a topic's
// channel and wakes the subscription's Receive on each notification. When
// the connection is lost it reconnects with backoff and wakes Receive once
// (notifications sent meanwhile are lost; the claim that follows finds their
// messages). Receive also polls, so a dead listener only adds latency.
type listener struct {
	stopped chan struct{}
}

func startListener(pool *pgxpool.Pool, channel string, wake chan<- struct{}, done <-chan struct{}, log *slog.Logger) *listener {
	l := &listener{stopped: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-done
		cancel()
	}()
	go func() {
		defer close(l.stopped)
		backoff := 100 * time.Millisecond
		for ctx.Err() == nil {
			err := listen(ctx, pool.Config().ConnConfig.Copy(), channel, wake, func() { backoff = 100 * time.Millisecond })
			if ctx.Err() != nil {
				return
			}
			log.Warn("keyorder postgres: listener lost its connection; reconnecting", "channel", channel, "err", err, "backoff", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 5*time.Second)
		}
	}()
	return l
}

func listen(ctx context.Context, cfg *pgx.ConnConfig, channel string, wake chan<- struct{}, connected func()) error {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	connected()
	signal(wake)
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		signal(wake)
	}
}

func signal(wake chan<- struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}

func (l *listener) wait() { <-l.stopped }
