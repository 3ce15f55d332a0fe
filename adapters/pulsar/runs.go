package pulsar

// This file: the run record (driver.StartRecorder, driver.Returner). The
// broker counts a nack but not a consumer that dies, so a message that
// kills its process would run forever as attempt 1. The driver keeps its
// own count on a topic of its own, <topic>-<subscription>-runs, one record
// per message (keyed by its position, so a redriven copy starts afresh):
//
//   - Lazily. Started only notes the start; a record is written when the
//     handler has run runRecordDelay and is still running (most handlers
//     end sooner and cost no write at all), with the runs it made so far.
//   - Receipts. Before a handler starts, the positions its consumer has
//     received are recorded (one receipt record per Receive that moves
//     them, written while the message waits in the process; Started waits
//     for it only when it has not landed yet). A consumer that opens reads
//     every other consumer's receipts: a message at or below one of them
//     was handed to a consumer before this one subscribed, and comes back
//     because that consumer went away.
//   - Synchronously when it matters. Such a message (see suspect) may have
//     been running, so its start is recorded before its handler starts,
//     and Started waits for it: a message that kills its process faster
//     than runRecordDelay is then counted from its second run on.
//   - Read at receive. Every driver reads the record topic to its end when
//     it opens (the high-water sync) and tails it afterwards; a delivery's
//     Attempt is one more than the larger of the broker's redelivery count
//     and the record's runs, and a returned message's remaining delay
//     becomes its NotBefore.
//   - Cleared when done. Ack (and DeadLetter) of a message with a record
//     writes a tombstone; Return writes the attempts and the delay.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/keyorder/keyorder/driver"
)

// Run record properties.
const (
	// PropRuns is a run record's count: the attempts its message used.
	PropRuns = "keyorder-runs"
	// PropRunDone marks a tombstone: the message is settled (or, for a
	// receipt, its consumer closed).
	PropRunDone = "keyorder-run-done"
	// PropReceived is a receipt's highest position received
	// (ledger:entry:batch) of the topic in PropReceivedTopic.
	PropReceived      = "keyorder-received"
	PropReceivedTopic = "keyorder-received-topic"
)

// propReturned marks a record written by Return: the message failed and
// was given back, it was not running when its consumer went away.
const propReturned = "keyorder-run-returned"

// receiptPrefix starts the key of a receipt record.
const receiptPrefix = "~received/"

// runRecordDelay is how long a handler runs before its start is recorded
// (unless it is suspect): a handler that ends sooner costs no write, and a
// process killed sooner runs the message once uncounted (then it is
// suspect). Far below any lease. A variable for the package's tests.
var runRecordDelay = 100 * time.Millisecond

// runSyncTimeout bounds how long a receive waits for the record topic's
// tail to catch up before it uses what it has read.
const runSyncTimeout = 10 * time.Second

// RunsTopic returns the run record topic of subscription sub on topic:
// <topic>-<sub>-runs.
func RunsTopic(topic, sub string) string { return topic + "-" + sub + "-runs" }

// tombstone is the runs argument of send that writes a tombstone.
const tombstone = -1

// runRecord is what the record topic says of one message.
type runRecord struct {
	runs      int
	notBefore time.Time
	returned  bool // written by Return
}

// runLog reads and writes the record topic of one driver.
type runLog struct {
	topic  string
	delay  time.Duration // runRecordDelay when opened
	prod   pulsar.Producer
	reader pulsar.Reader
	s      *subscriptionDriver

	id string // names this driver's receipts

	mu      sync.Mutex
	records map[string]runRecord
	recv    map[string]receiptMark // every consumer's receipts, by key
	sent    map[string]msgPos
	last    *receipt         // this driver's latest receipt write
	applied pulsar.MessageID // the last record read
	moved   chan struct{}    // closed (and replaced) when applied moves
	// lazy are the starts not recorded yet, in start order: in the
	// order they become due (writeLoop).
	lazy []lazyStart

	wake   chan struct{}
	stop   chan struct{}
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// lazyStart is a handler start whose record waits for runRecordDelay.
type lazyStart struct {
	d  *delivery
	at time.Time
}

// receiptMark is a consumer's highest position received of one topic.
type receiptMark struct {
	topic string
	id    msgPos
}

// receipt is one write of this driver's receipts; done is closed when it
// has landed (err set first).
type receipt struct {
	done chan struct{}
	err  error
	left atomic.Int32
}

// openRunLog opens the record topic of s and reads it to its end.
func openRunLog(ctx context.Context, s *subscriptionDriver) (*runLog, error) {
	topic := RunsTopic(s.topic, s.name)
	prod, err := s.client.CreateProducer(pulsar.ProducerOptions{
		Topic: topic, BatchingMaxPublishDelay: time.Millisecond, MaxPendingMessages: MaxPendingMessagesDefault,
	})
	if err != nil {
		return nil, fmt.Errorf("pulsar: producer for run records %s: %w", topic, err)
	}
	reader, err := s.client.CreateReader(pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.EarliestMessageID()})
	if err != nil {
		prod.Close()
		return nil, fmt.Errorf("pulsar: reader of run records %s: %w", topic, err)
	}
	l := &runLog{
		topic: topic, delay: runRecordDelay, prod: prod, reader: reader, s: s,
		records: map[string]runRecord{}, moved: make(chan struct{}),
		recv: map[string]receiptMark{}, sent: map[string]msgPos{}, id: randomID(),
		wake: make(chan struct{}, 1), stop: make(chan struct{}),
	}
	for reader.HasNext() {
		m, err := reader.Next(ctx)
		if err != nil {
			l.close()
			return nil, fmt.Errorf("pulsar: read run records %s: %w", topic, err)
		}
		l.apply(m)
	}
	tctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	l.wg.Add(2)
	go l.tail(tctx)
	go l.writeLoop()
	return l, nil
}

// apply takes in one record.
func (l *runLog) apply(m pulsar.Message) {
	props := m.Properties()
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case props[PropRunDone] != "":
		delete(l.records, m.Key())
		delete(l.recv, m.Key())
	case props[PropReceived] != "":
		if id, ok := parsePosition(props[PropReceived]); ok {
			l.recv[m.Key()] = receiptMark{topic: props[PropReceivedTopic], id: id}
		}
	case props[PropRuns] != "":
		n, err := strconv.Atoi(props[PropRuns])
		if err != nil {
			break
		}
		r := runRecord{runs: n, returned: props[propReturned] != ""}
		if v := props[PropNotBefore]; v != "" {
			r.notBefore, _ = time.Parse(time.RFC3339Nano, v)
		}
		l.records[m.Key()] = r
	}
	l.applied = m.ID()
	close(l.moved)
	l.moved = make(chan struct{})
}

// tail reads the records other consumers write, until the log closes.
func (l *runLog) tail(ctx context.Context) {
	defer l.wg.Done()
	failures := 0
	for {
		m, err := l.reader.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			level := slog.LevelWarn
			if failures++; failures > 1 {
				level = slog.LevelDebug
			}
			l.s.opts.Logger.Log(ctx, level, "keyorder: pulsar: reading run records failed; retrying", "topic", l.topic, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
		l.apply(m)
	}
}

// sync waits until the tail has read every record written before it was
// called (or ctx ends, or runSyncTimeout passes).
func (l *runLog) sync(ctx context.Context) error {
	last, err := l.reader.GetLastMessageID()
	if err != nil {
		return err
	}
	if last == nil || last.LedgerID() < 0 || last.EntryID() < 0 {
		return nil
	}
	timeout := time.NewTimer(runSyncTimeout)
	defer timeout.Stop()
	for {
		l.mu.Lock()
		done := l.applied != nil && notBefore(l.applied, last)
		moved := l.moved
		l.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return ctx.Err()
		case <-l.stop:
			return errClosed
		case <-timeout.C:
			return fmt.Errorf("pulsar: run records %s: the tail did not catch up within %v", l.topic, runSyncTimeout)
		}
	}
}

// notBefore reports whether a is at or after b (batch members compared
// when both have an index).
func notBefore(a, b msgPos) bool {
	if a.LedgerID() != b.LedgerID() {
		return a.LedgerID() > b.LedgerID()
	}
	if a.EntryID() != b.EntryID() {
		return a.EntryID() > b.EntryID()
	}
	return b.BatchIdx() < 0 || a.BatchIdx() >= b.BatchIdx()
}

// lookup returns the record of the message at pos.
func (l *runLog) lookup(pos string) (runRecord, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.records[pos]
	return r, ok
}

// send writes a record of d, or its tombstone (runs < 0), without
// waiting; done (if not nil) gets the result. Called with d.mu held, so
// that a record and a later tombstone of one delivery reach the topic in
// that order. returned marks a record of Return.
func (l *runLog) send(d *delivery, runs int, notBefore time.Time, returned bool, done func(error)) {
	props := map[string]string{PropRuns: strconv.Itoa(runs)}
	if runs < 0 {
		props = map[string]string{PropRunDone: "1"}
	} else {
		if !notBefore.IsZero() {
			props[PropNotBefore] = notBefore.UTC().Format(time.RFC3339Nano)
		}
		if returned {
			props[propReturned] = "1"
		}
	}
	l.prod.SendAsync(context.Background(), &pulsar.ProducerMessage{Key: d.pos, Properties: props},
		func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
			if err != nil {
				l.s.opts.Logger.Warn("keyorder: pulsar: writing a run record failed", "topic", l.topic, "message", d.pos, "err", err)
			}
			if done != nil {
				done(err)
			}
		})
}

// randomID names a driver's receipts.
func randomID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// msgPos is a place in a topic: a pulsar.MessageID, or one a receipt
// recorded.
type msgPos interface {
	LedgerID() int64
	EntryID() int64
	BatchIdx() int32
}

// recordedID is a position read from a receipt.
type recordedID struct {
	ledger, entry int64
	batch         int32
}

func (r recordedID) LedgerID() int64 { return r.ledger }
func (r recordedID) EntryID() int64  { return r.entry }
func (r recordedID) BatchIdx() int32 { return r.batch }

func formatPosition(id msgPos) string {
	return fmt.Sprintf("%d:%d:%d", id.LedgerID(), id.EntryID(), id.BatchIdx())
}

func parsePosition(v string) (msgPos, bool) {
	f := strings.Split(v, ":")
	if len(f) != 3 {
		return nil, false
	}
	l, err1 := strconv.ParseInt(f[0], 10, 64)
	e, err2 := strconv.ParseInt(f[1], 10, 64)
	b, err3 := strconv.ParseInt(f[2], 10, 32)
	if err1 != nil || err2 != nil || err3 != nil {
		return nil, false
	}
	return recordedID{l, e, int32(b)}, true
}

// highWater returns, per topic, the highest position any consumer's
// receipt records: what was handed to a consumer so far.
func (l *runLog) highWater() map[string]msgPos {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]msgPos{}
	for _, r := range l.recv {
		if h, ok := out[r.topic]; !ok || notBefore(r.id, h) {
			out[r.topic] = r.id
		}
	}
	return out
}

// otherHigh returns the highest position of topic that the receipts of
// the other consumers record.
func (l *runLog) otherHigh(topic string) (msgPos, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var high msgPos
	own := receiptPrefix + l.id + "/"
	for k, r := range l.recv {
		if r.topic == topic && !strings.HasPrefix(k, own) && (high == nil || notBefore(r.id, high)) {
			high = r.id
		}
	}
	return high, high != nil
}

// received records the positions of ds (just received) unless an earlier
// receipt covers them, and returns the receipt their handlers wait for.
func (l *runLog) received(ds []*delivery, topics []string) *receipt {
	high := map[string]msgPos{}
	for i, d := range ds {
		if h, ok := high[topics[i]]; !ok || notBefore(d.id, h) {
			high[topics[i]] = d.id
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	need := map[string]msgPos{}
	for t, id := range high {
		if s, ok := l.sent[t]; !ok || !notBefore(s, id) {
			need[t] = id
		}
	}
	if len(need) == 0 {
		return l.last
	}
	r := &receipt{done: make(chan struct{})}
	r.left.Store(int32(len(need)))
	var errMu sync.Mutex
	for t, id := range need {
		l.sent[t] = id
		l.prod.SendAsync(context.Background(), &pulsar.ProducerMessage{
			Key:        receiptPrefix + l.id + "/" + t,
			Properties: map[string]string{PropReceived: formatPosition(id), PropReceivedTopic: t},
		}, func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
			if err != nil {
				errMu.Lock()
				r.err = err
				errMu.Unlock()
			}
			if r.left.Add(-1) == 0 {
				close(r.done)
			}
		})
	}
	l.last = r
	return r
}

// awaitReceipt waits until r has landed.
func (l *runLog) awaitReceipt(ctx context.Context, r *receipt) error {
	if r == nil {
		return nil
	}
	select {
	case <-r.done:
		if r.err != nil {
			return fmt.Errorf("pulsar: record a receipt: %w", r.err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-l.stop:
		return errClosed
	}
}

// started notes that the handlers of ds start: a suspect delivery's runs
// are written now and waited for, the others' later (writeLoop).
func (l *runLog) started(ctx context.Context, ds []*delivery) error {
	for _, d := range ds {
		if err := l.awaitReceipt(ctx, d.receipt); err != nil {
			return err
		}
	}
	now := time.Now()
	var wait []chan error
	wake := false
	for _, d := range ds {
		lazy := false
		d.mu.Lock()
		d.runs++
		d.startedAt = now
		if d.suspect && !d.settled {
			n := d.base + d.runs
			d.recorded = n
			ch := make(chan error, 1)
			l.send(d, n, time.Time{}, false, func(err error) { ch <- err })
			wait = append(wait, ch)
		} else {
			lazy = true
		}
		d.mu.Unlock()
		if lazy {
			l.mu.Lock()
			wake = wake || len(l.lazy) == 0 // else writeLoop waits for the first
			l.lazy = append(l.lazy, lazyStart{d: d, at: now})
			l.mu.Unlock()
		}
	}
	if wake {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
	for _, ch := range wait {
		select {
		case err := <-ch:
			if err != nil {
				return fmt.Errorf("pulsar: record a start: %w", err)
			}
		case <-ctx.Done():
			return ctx.Err()
		case <-l.stop:
			return errClosed
		}
	}
	return nil
}

// writeLoop writes the runs of handlers that have run runRecordDelay and
// still run (or wait for a retry), until the log closes. The starts are
// queued in start order, so the loop sleeps until the first is due and
// never looks at one before then.
func (l *runLog) writeLoop() {
	defer l.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	var due []lazyStart
	for {
		select {
		case <-l.stop:
			return
		case <-l.wake:
		case <-t.C:
		}
		now := time.Now()
		l.mu.Lock()
		n := 0
		for n < len(l.lazy) && !now.Before(l.lazy[n].at.Add(l.delay)) {
			n++
		}
		due = append(due[:0], l.lazy[:n]...)
		clear(l.lazy[:n])
		l.lazy = l.lazy[n:]
		if len(l.lazy) > 0 {
			t.Reset(l.lazy[0].at.Add(l.delay).Sub(now))
		} else {
			l.lazy = nil
		}
		l.mu.Unlock()
		for _, e := range due {
			d := e.d
			d.mu.Lock()
			// A later start of d (a retry in process) has an entry of
			// its own.
			if n := d.base + d.runs; !d.settled && d.recorded < n && !d.startedAt.After(e.at) {
				d.recorded = n
				l.send(d, n, time.Time{}, false, nil)
			}
			d.mu.Unlock()
		}
		clear(due)
	}
}

// done writes the tombstone of a settled delivery that has a record.
func (l *runLog) done(d *delivery) {
	d.mu.Lock()
	if d.hadRecord || d.recorded > 0 {
		l.send(d, tombstone, time.Time{}, false, nil)
	}
	d.mu.Unlock()
}

// returned writes the attempts and retry time of rs and waits for them.
func (l *runLog) returned(ctx context.Context, ds []*delivery, rs []driver.Returned) error {
	chs := make([]chan error, len(ds))
	for i, d := range ds {
		ch := make(chan error, 1)
		chs[i] = ch
		d.mu.Lock()
		d.settled = true
		n := max(rs[i].Attempts, 0)
		d.recorded = n
		l.send(d, n, rs[i].NotBefore, true, func(err error) { ch <- err })
		d.mu.Unlock()
	}
	for i, ch := range chs {
		select {
		case err := <-ch:
			if err != nil {
				return fmt.Errorf("pulsar: return %q: %w", rs[i].Message.ID, err)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// close stops the log; writes already handed to the producer are flushed.
func (l *runLog) close() {
	select {
	case <-l.stop:
		return
	default:
	}
	close(l.stop)
	if l.cancel != nil {
		l.cancel()
	}
	l.wg.Wait()
	// A consumer that closes hands back only what it never ran or
	// returned with a record: its receipts need not make others suspect.
	l.mu.Lock()
	for t := range l.sent {
		l.prod.SendAsync(context.Background(), &pulsar.ProducerMessage{
			Key: receiptPrefix + l.id + "/" + t, Properties: map[string]string{PropRunDone: "1"},
		}, func(pulsar.MessageID, *pulsar.ProducerMessage, error) {})
	}
	l.mu.Unlock()
	l.prod.Close()
	l.reader.Close()
}

// Started records that the handlers of ms start (driver.StartRecorder):
// see the package documentation, "Runs". It returns at once unless one of
// ms may have been running in a consumer that went away; then it returns
// when that run is recorded.
func (s *subscriptionDriver) Started(ctx context.Context, ms []*driver.Message) error {
	if s.runs == nil {
		return nil
	}
	ds := make([]*delivery, 0, len(ms))
	for _, m := range ms {
		d, err := deliveryOf(m)
		if err != nil {
			return err
		}
		ds = append(ds, d)
	}
	return s.runs.started(ctx, ds)
}

// Return gives rs back (driver.Returner): their attempts and retry time
// are written to the run record, so the next delivery carries Attempt =
// Attempts+1 and NotBefore = the retry time; then they are forgotten as
// Release forgets them (the broker redelivers them when the consumer
// closes). Without the run record (NoRunRecord) it is Release: both are
// lost.
func (s *subscriptionDriver) Return(ctx context.Context, rs []driver.Returned) error {
	ds := make([]*delivery, len(rs))
	for i, r := range rs {
		d, err := deliveryOf(r.Message)
		if err != nil {
			return err
		}
		ds[i] = d
	}
	var err error
	if s.runs != nil {
		err = s.runs.returned(ctx, ds, rs)
	}
	for _, d := range ds {
		s.untrack(d)
	}
	return err
}
