package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/driverkit"
)

// producer returns the client that writes dead letters and redrives, made
// on first use. It may create the dead-letter topic (the broker's default
// partitions) when the broker allows auto-creation.
func (s *subscriptionDriver) producer() (*kgo.Client, error) {
	s.prodOnce.Do(func() {
		opts := append(append([]kgo.Opt(nil), s.opts.ClientOptions...), kgo.AllowAutoTopicCreation())
		if n := s.opts.MaxMessageBytes; n > MaxMessageBytesDefault {
			// franz-go refuses a record above its batch limit
			// (1,000,012 bytes by default) before sending it.
			opts = append(opts, kgo.ProducerBatchMaxBytes(int32(min(n, math.MaxInt32))))
		}
		s.prod, s.prodErr = kgo.NewClient(opts...)
	})
	return s.prod, s.prodErr
}

// truncateUTF8 cuts s to at most n bytes on a rune boundary.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// DeadLetter produces m to <topic>.<group>.dead with its key, headers, ID
// and keyorder-reason, keyorder-attempts and keyorder-dead-at, then
// completes it. If completing fails (its partition was revoked), m may be
// dead-lettered twice.
func (s *subscriptionDriver) DeadLetter(ctx context.Context, m *driver.Message, reason string, attempts int) error {
	if _, err := deliveryOf(m); err != nil {
		return err
	}
	r := copyRecord(s.deadTopic, &driver.Message{ID: m.ID, Key: m.Key, Payload: m.Payload, Headers: m.Headers, NotBefore: m.NotBefore})
	r.Headers = append(r.Headers,
		kgo.RecordHeader{Key: HeaderReason, Value: []byte(truncateUTF8(reason, maxReason))},
		kgo.RecordHeader{Key: HeaderAttempts, Value: []byte(strconv.Itoa(attempts))},
		kgo.RecordHeader{Key: HeaderDeadAt, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
	)
	p, err := s.producer()
	if err != nil {
		return err
	}
	err = p.ProduceSync(ctx, r).FirstErr()
	if errors.Is(err, kerr.MessageTooLarge) && s.opts.MaxMessageBytes > MaxMessageBytesDefault {
		// The dead-letter topic was auto-created with the broker's
		// default max.message.bytes: give it the subscription's.
		err = s.fitDeadTopic(ctx, p, r)
	}
	if err != nil {
		return fmt.Errorf("kafka: dead-letter to %s: %w", s.deadTopic, err)
	}
	return s.Ack(ctx, []*driver.Message{m})
}

// fitDeadTopic sets the dead-letter topic's max.message.bytes to
// MaxMessageBytes (creating the topic with it if it does not exist) and
// produces r again until the setting has reached the broker (at most
// connectTimeout, or until ctx ends).
func (s *subscriptionDriver) fitDeadTopic(ctx context.Context, p *kgo.Client, r *kgo.Record) error {
	v := strconv.Itoa(s.opts.MaxMessageBytes)
	adm := kadm.NewClient(p)
	cr, err := adm.CreateTopic(ctx, -1, -1, map[string]*string{"max.message.bytes": &v}, s.deadTopic)
	if err == nil {
		err = cr.Err
	}
	if errors.Is(err, kerr.TopicAlreadyExists) {
		var rs kadm.AlterConfigsResponses
		rs, err = adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: &v}}, s.deadTopic)
		for _, ar := range rs {
			if err == nil && ar.Err != nil {
				err = fmt.Errorf("%w: %s", ar.Err, ar.ErrMessage)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("set max.message.bytes=%s on %s: %w", v, s.deadTopic, err)
	}
	deadline := time.Now().Add(connectTimeout)
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		err := p.ProduceSync(ctx, r).FirstErr()
		if !errors.Is(err, kerr.MessageTooLarge) || time.Now().After(deadline) {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// readDead reads the whole dead-letter topic: the dead letters not
// redriven since, oldest first (by dead-letter time across partitions).
func (s *subscriptionDriver) readDead(ctx context.Context) ([]driver.DeadLetter, error) {
	p, err := s.producer()
	if err != nil {
		return nil, err
	}
	adm := kadm.NewClient(p)
	ends, err := adm.ListEndOffsets(ctx, s.deadTopic)
	if err != nil {
		return nil, fmt.Errorf("kafka: end offsets of %s: %w", s.deadTopic, err)
	}
	// Retention may have deleted a partition's records (its start offset
	// reached its end): there is nothing to wait for there.
	starts, err := adm.ListStartOffsets(ctx, s.deadTopic)
	if err != nil {
		return nil, fmt.Errorf("kafka: start offsets of %s: %w", s.deadTopic, err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		start, ok := starts.Lookup(o.Topic, o.Partition)
		if o.Err == nil && o.Offset > 0 && (!ok || start.Err != nil || start.Offset < o.Offset) {
			want[o.Partition] = o.Offset
		}
	})
	if len(want) == 0 {
		return nil, nil
	}
	parts := map[int32]kgo.Offset{}
	for p := range want {
		parts[p] = kgo.NewOffset().AtStart()
	}
	opts := append(append([]kgo.Opt(nil), s.opts.ClientOptions...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{s.deadTopic: parts}),
		kgo.FetchMaxWait(200*time.Millisecond))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var recs []*kgo.Record
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil && !isRetryable(ferr) {
			return nil, fmt.Errorf("kafka: read %s: %w", s.deadTopic, ferr)
		}
		fs.EachRecord(func(r *kgo.Record) {
			end, ok := want[r.Partition]
			if !ok || r.Offset >= end {
				return
			}
			recs = append(recs, r)
			if r.Offset+1 >= end {
				delete(want, r.Partition)
			}
		})
	}
	// Markers apply to what came before them; order by time of writing.
	sortByTime(recs)
	var log driverkit.DeadLog
	for _, r := range recs {
		if id, ok := header(r, HeaderRedriven); ok {
			log.Redriven(id)
			continue
		}
		log.Add(deadLetterOf(r))
	}
	return log.Letters(), nil
}

// sortByTime orders rs by (timestamp, partition, offset).
func sortByTime(rs []*kgo.Record) {
	slices.SortStableFunc(rs, func(a, b *kgo.Record) int {
		if c := a.Timestamp.Compare(b.Timestamp); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Partition, b.Partition); c != 0 {
			return c
		}
		return cmp.Compare(a.Offset, b.Offset)
	})
}

func header(r *kgo.Record, k string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == k {
			return string(h.Value), true
		}
	}
	return "", false
}

func deadLetterOf(r *kgo.Record) driver.DeadLetter {
	return driverkit.DeadLetterOf(fromRecord(r))
}

// deadStore is DeadLetters and Redrive over <topic>.<group>.dead: a
// redriven record is produced on the topic again (with its key, headers
// and ID, after everything produced meanwhile) and marked redriven on the
// dead-letter topic. It reaches every group of the topic, not only this
// one.
func (s *subscriptionDriver) deadStore() driverkit.LogStore {
	return driverkit.LogStore{
		Read:  s.readDead,
		Ready: func() error { _, err := s.producer(); return err },
		Republish: func(ctx context.Context, m *driver.Message) error {
			p, err := s.producer()
			if err == nil {
				err = p.ProduceSync(ctx, copyRecord(s.topic, m)).FirstErr()
			}
			if err != nil {
				return fmt.Errorf("kafka: redrive %q to %s: %w", m.ID, s.topic, err)
			}
			return nil
		},
		MarkRedriven: func(ctx context.Context, id string) error {
			p, err := s.producer()
			if err == nil {
				marker := &kgo.Record{Topic: s.deadTopic, Headers: []kgo.RecordHeader{{Key: HeaderRedriven, Value: []byte(id)}}}
				err = p.ProduceSync(ctx, marker).FirstErr()
			}
			if err != nil {
				return fmt.Errorf("kafka: redrive %q: mark dead letter redriven: %w", id, err)
			}
			return nil
		},
	}
}

// DeadLetters lists up to limit dead letters (all when limit <= 0), oldest
// first, reading <topic>.<group>.dead from its start.
func (s *subscriptionDriver) DeadLetters(ctx context.Context, limit int) ([]driver.DeadLetter, error) {
	return s.deadStore().DeadLetters(ctx, limit)
}

// Redrive produces the dead letters with these IDs on the topic again,
// with their key, headers and ID and without their not-before time, after
// everything produced meanwhile, and marks each redriven on the
// dead-letter topic. A redriven record reaches every group of the topic,
// not only this one.
func (s *subscriptionDriver) Redrive(ctx context.Context, ids []string) (int, error) {
	return s.deadStore().Redrive(ctx, ids)
}
