package driverkit

// This file: StartLog, the start records of a driver whose broker counts
// deliveries rather than runs (SQS, Pub/Sub), kept in a driver.StartStore.

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/keyorder/keyorder/driver"
)

// StartRecordDelay is how long after a handler starts its run is recorded
// (unless its message is suspect, see StartMark): a handler that ends
// sooner with success costs no write, and a process killed sooner runs the
// message once uncounted (it then comes back suspect). It matches the
// PostgreSQL driver's start marks.
const StartRecordDelay = 100 * time.Millisecond

// startStoreTries is how many times a store call is tried before its
// failure is logged.
const startStoreTries = 3

// startStoreTimeout bounds one store call.
const startStoreTimeout = 10 * time.Second

// StartMark is one delivery's start record: a driver keeps it in the
// delivery's AckID and passes it to its StartLog.
type StartMark struct {
	// ID is the broker's ID of the message's copy (the store's id).
	ID string
	// Msg is the message's own ID (keyorder's), for logs only.
	Msg string
	// Earlier is how many earlier deliveries of the copy the broker counts
	// (set by the driver before Resolve): the store is read only when
	// it is above 0, and a message whose earlier deliveries outnumber its
	// recorded runs is suspect: one of them may have run unrecorded, so
	// its starts are recorded synchronously.
	Earlier int

	mu      sync.Mutex
	runs    int  // recorded at receive plus the starts since
	written int  // runs known to be in the store
	suspect bool // record each start before the handler runs
	settled bool // acknowledged or dead-lettered: nothing more to write
	failed  bool // Resolve could not read the store
}

// Runs returns the runs the message has made: those recorded when it was
// received (Resolve) and the starts since.
func (m *StartMark) Runs() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.runs
}

// Suspect reports whether the message's starts are recorded before its
// handler runs.
func (m *StartMark) Suspect() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.suspect
}

// StartLog records, for one subscription, which messages' handlers
// started, in a driver.StartStore; see driver.StartStore for what it
// costs. Its methods may be called concurrently.
type StartLog struct {
	store driver.StartStore
	sub   string
	log   *slog.Logger
	delay time.Duration

	mu      sync.Mutex
	pending map[*StartMark]struct{}
	forget  []string
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	closed  bool
}

// NewStartLog returns the start log of subscription sub in store, and
// starts its writer; Close stops it. delay <= 0 means StartRecordDelay.
func NewStartLog(store driver.StartStore, sub string, log *slog.Logger, delay time.Duration) *StartLog {
	if delay <= 0 {
		delay = StartRecordDelay
	}
	if log == nil {
		log = slog.Default()
	}
	l := &StartLog{
		store: store, sub: sub, log: log, delay: delay,
		pending: map[*StartMark]struct{}{},
		wake:    make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	go l.loop()
	return l
}

// Resolve reads the recorded runs of the marks whose Earlier is above 0,
// in one store call, and marks suspect those whose earlier deliveries
// outnumber their runs. On error every mark it had to read is left at 0
// runs, not suspect, with Failed set; the driver then counts as it does
// without a store.
func (l *StartLog) Resolve(ctx context.Context, ms []*StartMark) error {
	var ids []string
	for _, m := range ms {
		if m.Earlier > 0 {
			ids = append(ids, m.ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	var runs map[string]int
	err := l.try(ctx, func(ctx context.Context) error {
		var err error
		runs, err = l.store.Runs(ctx, l.sub, ids)
		return err
	})
	for _, m := range ms {
		if m.Earlier <= 0 {
			continue
		}
		m.mu.Lock()
		if err != nil {
			m.failed = true
		} else {
			r := max(runs[m.ID], 0)
			m.runs, m.written = r, r
			m.suspect = m.Earlier > r
		}
		m.mu.Unlock()
	}
	return err
}

// Failed reports whether Resolve could not read the mark's runs.
func (m *StartMark) Failed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.failed
}

// LogRecordingFirst is the message of the debug line StartLog.Started logs
// for each mark, naming its message (id), before it writes the start of a
// suspect message, that is before its handler runs. A process that dies
// between that write and the handler's start (killed, or exited by another
// message's handler), or a lease lost during the write (the subscriber then
// does not run the message), leaves one recorded start the handler never
// made: it counts against the message's attempts like a run, because no
// reader of the store can tell it from a handler killed in its first
// instant (the run a poison message makes). Crash tests read this line to
// tell such a start from a run that was never recorded.
const LogRecordingFirst = "keyorder: recording a handler start before it runs"

// Started counts a start of each mark. It returns at once, the runs to be
// written after the log's delay, unless one of the marks is suspect: then
// it records them all before it returns (see LogRecordingFirst).
func (l *StartLog) Started(ctx context.Context, ms []*StartMark) error {
	wait := false
	for _, m := range ms {
		m.mu.Lock()
		m.runs++
		wait = wait || m.suspect
		m.mu.Unlock()
	}
	if wait {
		for _, m := range ms {
			l.log.Debug(LogRecordingFirst, "subscription", l.sub, "id", m.Msg, "copy", m.ID)
		}
		return l.write(ctx, ms)
	}
	l.mu.Lock()
	for _, m := range ms {
		l.pending[m] = struct{}{}
	}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return nil
}

// Flush writes the runs of ms that are not written yet, at once: a driver
// calls it before it hands a failed message back to the broker (a nack, a
// graceful stop's return), so that the next process to receive it reads
// its run.
func (l *StartLog) Flush(ctx context.Context, ms []*StartMark) error {
	return l.write(ctx, ms)
}

// Settled tells the log that ms are acknowledged or dead-lettered: their
// runs need no write, and their records are deleted (batched, after the
// log's delay).
func (l *StartLog) Settled(ms []*StartMark) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range ms {
		m.mu.Lock()
		m.settled = true
		recorded := m.written > 0
		m.mu.Unlock()
		delete(l.pending, m)
		if recorded {
			l.forget = append(l.forget, m.ID)
		}
	}
	if len(l.forget) > 0 {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
}

// write records the unwritten runs of ms now.
func (l *StartLog) write(ctx context.Context, ms []*StartMark) error {
	runs := map[string]int{}
	for _, m := range ms {
		m.mu.Lock()
		if m.runs > m.written {
			runs[m.ID] = max(runs[m.ID], m.runs)
		}
		m.mu.Unlock()
	}
	if len(runs) == 0 {
		return nil
	}
	err := l.try(ctx, func(ctx context.Context) error { return l.store.Record(ctx, l.sub, runs) })
	if err != nil {
		return err
	}
	for _, m := range ms {
		m.mu.Lock()
		m.written = max(m.written, runs[m.ID])
		m.mu.Unlock()
	}
	return nil
}

// try calls f up to startStoreTries times, each bounded by
// startStoreTimeout, while ctx lasts.
func (l *StartLog) try(ctx context.Context, f func(context.Context) error) error {
	var err error
	for i := range startStoreTries {
		if i > 0 {
			select {
			case <-ctx.Done():
				return errors.Join(err, ctx.Err())
			case <-time.After(time.Duration(i) * 20 * time.Millisecond):
			}
		}
		cctx, cancel := context.WithTimeout(ctx, startStoreTimeout)
		err = f(cctx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// loop writes the pending runs and forgets the settled records, the log's
// delay after the first of them, until Close; then once more.
func (l *StartLog) loop() {
	defer close(l.done)
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	for {
		select {
		case <-l.wake:
			t.Reset(l.delay)
			select {
			case <-t.C:
			case <-l.stop:
				l.flushPending()
				return
			}
		case <-l.stop:
			l.flushPending()
			return
		}
		l.flushPending()
	}
}

// flushPending writes the pending marks not settled meanwhile, then
// forgets the settled ones' records.
func (l *StartLog) flushPending() {
	l.mu.Lock()
	ms := make([]*StartMark, 0, len(l.pending))
	for m := range l.pending {
		ms = append(ms, m)
	}
	clear(l.pending)
	forget := l.forget
	l.forget = nil
	l.mu.Unlock()
	ctx := context.Background()
	if len(ms) > 0 {
		if err := l.write(ctx, ms); err != nil {
			l.log.Warn("keyorder: recording started handlers in the start store failed; a crash now may run them once uncounted",
				"subscription", l.sub, "count", len(ms), "err", err)
		}
	}
	if len(forget) > 0 {
		if err := l.try(ctx, func(ctx context.Context) error { return l.store.Forget(ctx, l.sub, forget) }); err != nil {
			l.log.Warn("keyorder: deleting the start records of settled messages failed; the store expires them",
				"subscription", l.sub, "count", len(forget), "err", err)
		}
	}
}

// Close writes what is pending and stops the writer. It is idempotent.
func (l *StartLog) Close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		<-l.done
		return
	}
	l.closed = true
	l.mu.Unlock()
	close(l.stop)
	<-l.done
}
