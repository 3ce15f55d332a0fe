package postgres

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
)

// Started marks (driver.StartRecorder, migration 004). A lost lease counts
// an attempt only for the chain members whose handler started, so the
// driver records, per leased chain, the highest id whose handler started
// (heads.started_end; members start in id order). Why it is written the way
// it is:
//
//   - Off the handlers' path. Started only notes the id in its chain;
//     startsLoop writes the marks noted, startWriteDelay after the first of
//     them, all in one statement (an UPDATE of the chains' head rows, not of
//     each message). A handler never waits for it, except for a suspect
//     message (below).
//   - Only while it matters. When the write comes, a chain whose last
//     started member is already being settled is skipped: every member up
//     to it has finished its handler, so a lost lease has nothing running
//     to count. Handlers faster than startWriteDelay thus cost no write at
//     all; a slower one costs one head row update per chain per write.
//     Measured with BenchmarkStackOrdered (no-op handler, 1,000 keys,
//     50,000 messages): 0.1-0.4 writes and 2-15 head row updates per 1,000
//     messages, against the ~200 head row updates per 1,000 that claims and
//     releases make (with a 10 ms delay: 1-2.3 writes and 34-75 rows).
//   - Bounded when late. A handler that kills its process before its mark
//     lands (within startWriteDelay and a round trip of its start) runs
//     again uncounted. The claim that takes over such a lease raises the
//     first unmarked member's deliveries.unstarted instead of its attempts;
//     the next claim returns it as suspect, and Started writes a suspect
//     message's mark at once and waits for it, so its next run is counted
//     however fast it kills its process. A message that kills its consumer
//     every time thus runs at most once more than its attempt limit allows
//     (and, should marks keep failing, the third unmarked loss is counted
//     anyway).
//   - In key order. The head rows are locked in key order before they are
//     written, as publishers and releases lock them, so a mark never
//     deadlocks with them; a mark of a chain whose lease is gone (settled,
//     or lost and taken over) matches no row and changes nothing.

// startWriteDelay is how long after a handler starts its mark is written
// (unless it is suspect): a handler that finishes sooner costs no write, and
// a process killed sooner loses the run's count once (then the message is
// suspect). Far below any lease (LeaseDurationMin is 1s).
const startWriteDelay = 100 * time.Millisecond

// starts collects the marks to write.
type starts struct {
	mu      sync.Mutex
	pending map[*chain]int64 // highest started id per chain, not written yet
	cur     *startWrite      // the write the pending marks go into
	writing *startWrite      // the write under way, if any
	wake    chan struct{}    // marks were noted
	urgent  chan struct{}    // a suspect mark waits: write now
}

// startWrite is one write of marks; done is closed when it has ended.
type startWrite struct {
	done chan struct{}
	err  error
}

func (st *starts) init() {
	st.pending = map[*chain]int64{}
	st.cur = &startWrite{done: make(chan struct{})}
	st.wake = make(chan struct{}, 1)
	st.urgent = make(chan struct{}, 1)
}

// startTries is how many times a write of marks is tried when it fails
// retryably (a deadlock with a lease renewal, a restarting server).
const startTries = 3

// Started records that the handlers of ms start (driver.StartRecorder).
// It returns at once, unless one of ms is suspect: then it returns when
// the mark has been written (or ctx ends). Direct deliveries (Parallel, or
// keyless) are counted at claim and need no mark.
func (su *pgSubscription) Started(ctx context.Context, ms []*driver.Message) error {
	if su.starts.wake == nil {
		return nil // not keyed: nothing to mark
	}
	as, err := ackIDs(ms)
	if err != nil {
		return err
	}
	wait, noted := false, false
	for _, a := range as {
		c := a.chain
		if c == nil {
			continue
		}
		c.mu.Lock()
		later := a.id > c.started
		if later {
			c.started = a.id
		}
		c.mu.Unlock()
		if !later {
			continue
		}
		su.starts.mu.Lock()
		su.starts.pending[c] = a.id
		su.starts.mu.Unlock()
		noted = true
		wait = wait || a.suspect
	}
	if !noted {
		return nil
	}
	su.starts.mu.Lock()
	w := su.starts.cur
	su.starts.mu.Unlock()
	if !wait {
		signal(su.starts.wake)
		return nil
	}
	signal(su.starts.urgent)
	select {
	case <-w.done:
		if w.err != nil {
			return fmt.Errorf("postgres: record started: %w", w.err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-su.done:
		return keyorder.ErrClosed
	}
}

// startsLoop writes the marks noted, startWriteDelay after the first of
// them (at once when a suspect one waits), until the subscription closes;
// then it writes what is pending once more.
func (su *pgSubscription) startsLoop() {
	defer su.maint.Done()
	st := &su.starts
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	for {
		select {
		case <-st.wake:
			t.Reset(startWriteDelay)
			select {
			case <-t.C:
			case <-st.urgent:
				t.Stop()
			case <-su.done:
				su.writeStarts()
				return
			}
		case <-st.urgent:
		case <-su.done:
			su.writeStarts()
			return
		}
		su.writeStarts()
	}
}

// writeStarts writes the pending marks in one round trip.
func (su *pgSubscription) writeStarts() {
	st := &su.starts
	st.mu.Lock()
	if len(st.pending) == 0 {
		st.mu.Unlock()
		return
	}
	p, w := st.pending, st.cur
	st.pending = map[*chain]int64{}
	st.cur = &startWrite{done: make(chan struct{})}
	st.writing = w
	st.mu.Unlock()
	defer func() {
		st.mu.Lock()
		st.writing = nil
		st.mu.Unlock()
		close(w.done)
	}()
	chains := make([]*chain, 0, len(p))
	for c, id := range p {
		// A member whose settlement has begun has finished its handler,
		// and so have the members before it (they start in order): a
		// lost lease then has nothing running to count, and the mark is
		// not worth a row update. Fast handlers are mostly settled by now.
		c.mu.Lock()
		_, running := c.unsettled[id]
		c.mu.Unlock()
		if running {
			chains = append(chains, c)
		}
	}
	if len(chains) == 0 {
		return
	}
	slices.SortFunc(chains, func(x, y *chain) int { return strings.Compare(x.key, y.key) })
	keys := make([]string, len(chains))
	tokens := make([]int64, len(chains))
	ids := make([]int64, len(chains))
	for i, c := range chains {
		keys[i], tokens[i], ids[i] = c.key, c.token, p[c]
	}
	ctx, cancel := context.WithTimeout(context.Background(), su.lease)
	defer cancel()
	for try := 1; ; try++ {
		_, w.err = su.s.pool.Exec(ctx, su.s.sql(sqlStarted), su.info.id, keys, tokens, ids)
		if w.err == nil || try == startTries || !IsRetryable(w.err) || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Duration(try) * 10 * time.Millisecond)
	}
	if w.err != nil {
		su.opts.Logger.Warn("keyorder postgres: recording started handlers failed; a lease lost now counts no attempt for them",
			"subscription", su.info.name, "chains", len(chains), "err", w.err)
	}
}
