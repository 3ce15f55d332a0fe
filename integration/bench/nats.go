package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	knats "github.com/keyorder/keyorder/adapters/nats"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// natsPartitions is the partition count of keyorder's benchmark streams.
const natsPartitions = 8

func natsBackend(context.Context) (*backend, error) {
	addr, err := env("KEYORDER_NATS_URL", "nats")
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(addr)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	drop := func(id string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, id)
		_ = js.DeleteStream(ctx, knats.DeadLetterStream(id))
		_ = js.DeleteKeyValue(ctx, knats.LeaseBucket(id, "bench"))
		_ = js.DeleteKeyValue(ctx, knats.StateBucket(id, "bench"))
	}
	// Each endpoint gets its own connections, as separate processes would.
	// topt are the topic's options (nil: defaults, with Nats-Msg-Id).
	factory := func(topt *knats.TopicOptions) koFactory {
		return func(ctx context.Context, id string) (*koDriver, error) {
			pc, err := nats.Connect(addr)
			if err != nil {
				return nil, err
			}
			pjs, _ := jetstream.New(pc)
			if _, err := knats.EnsureStream(ctx, pjs, id, natsPartitions); err != nil {
				pc.Close()
				return nil, err
			}
			sc, err := nats.Connect(addr)
			if err != nil {
				pc.Close()
				return nil, err
			}
			sjs, _ := jetstream.New(sc)
			sopts := &knats.SubscriptionOptions{Ordering: policy.Ordered, Logger: quiet()}
			return &koDriver{
				openPub: func(ctx context.Context, cfg *publish.Config) (*publish.Publisher, error) {
					return knats.OpenTopic(ctx, pjs, id, topt, cfg)
				},
				openSub: func(ctx context.Context, cfg *subscribe.Config) (*subscribe.Subscriber, error) {
					return knats.OpenSubscription(ctx, sjs, id, "bench", sopts, cfg)
				},
				cleanup: func() { pc.Close(); sc.Close(); drop(id) },
			}, nil
		}
	}
	t := koTuning{
		subscribe:  subscribe.Config{Workers: 64, MaxOutstanding: 2000},
		publish:    publish.Config{MaxBatch: 1000},
		publishers: 4, chunk: 1000,
	}
	return &backend{
		name:  "nats",
		title: "NATS JetStream (nats-server 2.15.3)",
		note: fmt.Sprintf("Raw: nats.go jetstream, PublishMsgAsync of every message then PublishAsyncComplete; one durable pull consumer "+
			"(Consume, explicit acks) handling each message in its callback; \"raw nats.go + Nats-Msg-Id\" sends a 36-character "+
			"Nats-Msg-Id per message, which the stream checks and records in its duplicate window (2 minutes). keyorder: streams of %d partitions, "+
			"Ordered, %s, one owner per partition (here one process); by default each message carries its ID as Nats-Msg-Id, "+
			"and its ×raw ratios divide by \"raw nats.go + Nats-Msg-Id\"; the msg_id=off rows (TopicOptions.NoMsgID) send none "+
			"and divide by plain \"raw nats.go\"; \"raw nats.go + Keyorder-Id\" sends the 36-character ID in the header those rows carry, "+
			"which the server parses and stores but does not check.", natsPartitions, lanesNote(64)),
		systems: append([]system{{name: "raw nats.go", ref: true, open: natsRawOpen(addr, natsRaw{drop: drop})}},
			append(natsRawAttrs(addr, drop), natsKoSystems(factory, t)...)...),
		close: nc.Close,
	}, nil
}

// natsRaw is nats.go's jetstream package on its own.
type natsRaw struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	stream string
	drop   func(string)
	msgID  bool // each message carries a Nats-Msg-Id header
	header bool // each message carries its ID in a Keyorder-Id header, as keyorder's msg_id=off
	idBase uint32
}

// natsMsgIDRaw names the raw client sending a Nats-Msg-Id per message;
// natsHeaderRaw the raw client sending the ID in a Keyorder-Id header.
const (
	natsMsgIDRaw  = "raw nats.go + Nats-Msg-Id"
	natsHeaderRaw = "raw nats.go + Keyorder-Id"
)

// natsKoSystems returns keyorder's systems twice: with the Nats-Msg-Id
// (the default), compared with the raw client sending the same header,
// and with msg_id=off, compared with the plain raw client. One run then
// shows both: what keyorder costs over the raw client doing the same
// thing, and what the duplicate window costs.
func natsKoSystems(factory func(*knats.TopicOptions) koFactory, t koTuning) []system {
	out := koSystems(factory(nil), t)
	for i := range out {
		out[i].refName = natsMsgIDRaw
	}
	for _, s := range koSystems(factory(&knats.TopicOptions{NoMsgID: true}), t) {
		s.name += " msg_id=off"
		s.refName = "raw nats.go"
		out = append(out, s)
	}
	return out
}

// natsRawAttrs returns the raw client publishing each message with a
// Nats-Msg-Id header as keyorder does (a 36-character ID): the stream then
// checks and records every ID in its duplicate window, which the plain raw
// side skips. And the raw client sending the ID in a Keyorder-Id header,
// as keyorder's msg_id=off does: the server parses and stores a header it
// does not check, which the plain raw side (no header) skips too.
func natsRawAttrs(addr string, drop func(string)) []system {
	return []system{
		{name: natsMsgIDRaw, open: natsRawOpen(addr, natsRaw{drop: drop, msgID: true})},
		{name: natsHeaderRaw, open: natsRawOpen(addr, natsRaw{drop: drop, header: true})},
	}
}

// natsRawOpen returns a system's open for the raw client shaped as raw:
// its own connection and a stream named id over the subjects id.>, with
// a duplicate window of 2 minutes where raw sends a Nats-Msg-Id.
func natsRawOpen(addr string, raw natsRaw) func(context.Context, string) (endpoint, error) {
	return func(ctx context.Context, id string) (endpoint, error) {
		c, err := nats.Connect(addr)
		if err != nil {
			return nil, err
		}
		cjs, _ := jetstream.New(c)
		cfg := jetstream.StreamConfig{Name: id, Subjects: []string{id + ".>"}}
		if raw.msgID {
			cfg.Duplicates = 2 * time.Minute
		}
		if _, err := cjs.CreateStream(ctx, cfg); err != nil {
			c.Close()
			return nil, err
		}
		r := raw
		r.nc, r.js, r.stream = c, cjs, id
		if r.msgID || r.header {
			r.idBase = uint32(time.Now().UnixNano())
		}
		return &r, nil
	}
}

func (e *natsRaw) publish(ctx context.Context, w *workload) error {
	futs := make([]jetstream.PubAckFuture, 0, w.n())
	for i := range w.n() {
		subject := e.stream + "." + hex.EncodeToString([]byte(w.key(i)))
		if e.msgID || e.header {
			m := nats.NewMsg(subject)
			m.Data = w.payloads[i]
			name := nats.MsgIdHdr
			if e.header {
				name = knats.HeaderID
			}
			m.Header.Set(name, fmt.Sprintf("%08x-0000-7000-8000-%012x", e.idBase, i))
			f, err := retryStalled(ctx, e.js, func() (jetstream.PubAckFuture, error) { return e.js.PublishMsgAsync(m) })
			if err != nil {
				return err
			}
			futs = append(futs, f)
			continue
		}
		f, err := retryStalled(ctx, e.js, func() (jetstream.PubAckFuture, error) { return e.js.PublishAsync(subject, w.payloads[i]) })
		if err != nil {
			return err
		}
		futs = append(futs, f)
	}
	select {
	case <-e.js.PublishAsyncComplete():
	case <-ctx.Done():
		return ctx.Err()
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		}
	}
	return nil
}

// retryStalled calls publish until it is not refused for a stalled async
// window (a loaded server can stall the client's 4,000 unacknowledged
// publishes), waiting for the window to drain in between, as an
// application would.
func retryStalled(ctx context.Context, js jetstream.JetStream, publish func() (jetstream.PubAckFuture, error)) (jetstream.PubAckFuture, error) {
	for {
		f, err := publish()
		if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			return f, err
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (e *natsRaw) consume(ctx context.Context, chk *orderCheck) error {
	cons, err := e.js.CreateOrUpdateConsumer(ctx, e.stream, jetstream.ConsumerConfig{
		Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 10000,
	})
	if err != nil {
		return err
	}
	// With handler work the callback sleeps it: one consumer keeps the
	// stream's order only by handling in its callback, one at a time.
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if handlerWork > 0 {
			time.Sleep(handlerWork)
		}
		chk.see(m.Data())
		_ = m.Ack()
	})
	if err != nil {
		return err
	}
	<-ctx.Done()
	cc.Stop()
	return nil
}

func (e *natsRaw) close() {
	e.nc.Close()
	e.drop(e.stream)
}
