package nats

// This file: the run records (driver.StartRecorder, driver.Returner). The
// server counts deliveries, not runs: a message that waited unrun in a
// process that died comes back with its count one higher, and the retries
// the subscriber runs in process are no deliveries at all. So the driver
// counts a message's runs itself, in the subscription's state bucket
// (StateBucket), one entry per message, r.<stream sequence> (a redriven
// copy is a new sequence and starts afresh):
//
//   - A first delivery (the server's count is 1) has no record and is
//     attempt 1: nothing is read.
//   - A redelivery's record is read before it is handed out; its attempt
//     is one more than the runs recorded, and a retry time the record
//     carries (Return) becomes its NotBefore.
//   - Lazily on a first delivery: a handler still running runRecordDelay
//     after its start is recorded then (most end sooner and cost no
//     write); a retry in process is recorded when it starts, in the
//     background.
//   - Synchronously on a redelivery: its start is recorded before its
//     handler runs. A message that kills its process before a lazy record
//     lands runs once uncounted; from its redelivery on every run is
//     counted, so it reaches its attempt limit within MaxAttempts+1 runs.
//   - Before a started message goes back (a lost partition, Release,
//     Nack), and by Return with the attempts and retry time the
//     subscriber gives.
//   - Cleared (in the background) when the message is acknowledged or
//     dead-lettered.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/driverkit"
)

// runRecordDelay is how long a first delivery's handler runs before its
// start is recorded. A variable for the package's tests.
var runRecordDelay = 100 * time.Millisecond

// runRecord is a run record's value.
type runRecord struct {
	// Runs is the attempts the message used.
	Runs int `json:"runs"`
	// NotBefore is when its retry is due (Unix nanoseconds); 0 for at
	// once.
	NotBefore int64 `json:"nb,omitempty"`
}

func runKey(seq uint64) string { return "r." + strconv.FormatUint(seq, 10) }

// readRun reads the run record of a redelivered message into in. A record
// that cannot be read counts every earlier delivery as a run (the safe
// side for a message that may kill its process).
func (s *subscriptionDriver) readRun(ctx context.Context, in *inMsg) {
	in.runs = 0
	if in.meta.NumDelivered <= 1 {
		return
	}
	e, err := s.state.Get(ctx, runKey(in.meta.Sequence.Stream))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return
	case err == nil:
		var r runRecord
		if err = json.Unmarshal(e.Value(), &r); err == nil {
			in.runs, in.hasRec = max(r.Runs, 0), true
			if r.NotBefore > 0 {
				in.notBefore = time.Unix(0, r.NotBefore)
			}
			return
		}
	}
	s.opts.Logger.Warn("keyorder: nats: reading a run record failed; counting every delivery as a run",
		"subscription", s.sub, "seq", in.meta.Sequence.Stream, "err", err)
	in.runs = int(in.meta.NumDelivered) - 1
}

// runs is the attempts d's message used so far. Called with s.mu held.
func (d *delivery) runs() int { return d.in.runs + d.starts }

// record writes d's runs (and retry time, once Return set it) to its run
// record, unless they are recorded already or d was acknowledged. Writes
// of one delivery are serialized, each with the latest count.
func (s *subscriptionDriver) record(ctx context.Context, d *delivery) error {
	d.recMu.Lock()
	defer d.recMu.Unlock()
	s.mu.Lock()
	r := runRecord{Runs: d.runs()}
	if !d.notBefore.IsZero() {
		r.NotBefore = d.notBefore.UnixNano()
	}
	skip := d.acked || (r.Runs <= d.recorded && !d.returned)
	d.writing = !skip
	s.mu.Unlock()
	if skip {
		return nil
	}
	b, _ := json.Marshal(r)
	_, err := s.state.Put(ctx, runKey(d.in.meta.Sequence.Stream), b)
	s.mu.Lock()
	d.writing = false
	if err == nil {
		d.recorded = max(d.recorded, r.Runs)
	}
	// A failed write may have landed: clear it too.
	d.in.hasRec = true
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("nats: record the runs of %s: %w", d.in.msg.Subject(), err)
	}
	return nil
}

// clearRun deletes d's run record, if it has one, in the background
// (after a write in flight). Called with s.mu held, once d is settled as
// acknowledged.
func (s *subscriptionDriver) clearRun(d *delivery) {
	d.acked = true
	if !d.in.hasRec && !d.writing {
		return // no record, and none is written from now on
	}
	s.recWG.Add(1)
	go func() {
		defer s.recWG.Done()
		d.recMu.Lock()
		defer d.recMu.Unlock()
		s.mu.Lock()
		has := d.in.hasRec
		s.mu.Unlock()
		if !has {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.state.Delete(ctx, runKey(d.in.meta.Sequence.Stream))
	}()
}

// recordLazily writes the records of first deliveries whose handler has
// run runRecordDelay (called by the ownership loop).
func (s *subscriptionDriver) recordLazily() {
	now := time.Now()
	var ds []*delivery
	s.mu.Lock()
	for d := range s.live {
		if d.starts > 0 && !d.settled && d.runs() > d.recorded && now.Sub(d.startedAt) >= runRecordDelay {
			ds = append(ds, d)
		}
	}
	s.mu.Unlock()
	if len(ds) == 0 {
		return
	}
	s.recWG.Add(1)
	go func() {
		defer s.recWG.Done()
		ctx, cancel := context.WithTimeout(context.Background(), s.tick())
		defer cancel()
		for _, d := range ds {
			if err := s.record(ctx, d); err != nil {
				s.opts.Logger.Debug("keyorder: nats: recording a run failed", "subscription", s.sub, "err", err)
			}
		}
	}()
}

// chargeWindow is how long the other handlers wait to start after a
// charged message starts (see Started), unless it settles sooner.
var chargeWindow = 200 * time.Millisecond

// charged reports whether d may be a message that kills its process: it
// comes back with runs recorded and not completed. Called with s.mu held.
func (d *delivery) charged() bool { return d.in.meta.NumDelivered > 1 && d.in.runs > 0 }

// Started records that the handlers of ms start (driver.StartRecorder):
// a redelivery's start synchronously, before this returns; a retry in
// process in the background; a first delivery's only once its handler
// ran runRecordDelay (see recordLazily).
//
// A charged message (see charged) starts alone: it waits for the starts
// being recorded, and for chargeWindow after its start (or until it
// settles) no other handler starts. A message that kills its process as
// it starts then takes no other message's start record with it: a start
// recorded just before its process died, whose handler never ran, would
// count a run that did not happen, and a few such deaths would
// dead-letter a message that never ran.
func (s *subscriptionDriver) Started(ctx context.Context, ms []*driver.Message) error {
	var ds []*delivery
	var ids []string // the message IDs of ds, for the log
	charged := false
	s.mu.Lock()
	for _, m := range ms {
		if d, ok := m.AckID.(*delivery); ok && d != nil && !d.settled {
			ds = append(ds, d)
			ids = append(ids, m.ID)
			charged = charged || d.charged()
		}
	}
	if len(ds) == 0 {
		s.mu.Unlock()
		return nil
	}
	// Every start waits for a charged one's window, charged ones too: two
	// charged messages never start together.
	for s.gate != nil && !s.gate.settled && time.Now().Before(s.gateUntil) {
		ch, wait := s.settled, time.Until(s.gateUntil)
		s.mu.Unlock()
		select {
		case <-ch:
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
		s.mu.Lock()
	}
	if charged {
		// Its window opens now; the starts being recorded end first.
		s.gate, s.gateUntil = ds[0], time.Now().Add(time.Hour)
		for s.starting > 0 {
			ch := s.settled
			s.mu.Unlock()
			select {
			case <-ch:
			case <-time.After(5 * time.Millisecond):
			}
			s.mu.Lock()
		}
	}
	now := time.Now()
	var sync, async []*delivery
	var logged []string
	for i, d := range ds {
		d.started.Store(true)
		d.starts++
		d.startedAt = now
		switch {
		case d.in.meta.NumDelivered > 1:
			sync = append(sync, d)
			logged = append(logged, ids[i])
		case d.starts > 1:
			async = append(async, d)
			logged = append(logged, ids[i])
		}
	}
	if len(sync) > 0 && !charged {
		s.starting++
	}
	s.mu.Unlock()
	// A start written here may land while its handler never runs (the
	// process is killed before it begins): the record then counts a run
	// that did not happen, like a handler killed in its first instant.
	// Said before the write, so that a crash test can tell the two apart
	// (driverkit.LogRecordingFirst).
	for _, id := range logged {
		s.opts.Logger.Debug(driverkit.LogRecordingFirst, "subscription", s.sub, "id", id)
	}
	for _, d := range async {
		s.recWG.Add(1)
		go func() {
			defer s.recWG.Done()
			ctx, cancel := context.WithTimeout(context.Background(), s.opts.Lease)
			defer cancel()
			if err := s.record(ctx, d); err != nil {
				s.opts.Logger.Debug("keyorder: nats: recording a retry failed", "subscription", s.sub, "err", err)
			}
		}()
	}
	var first error
	for _, d := range sync {
		if err := s.record(ctx, d); err != nil && first == nil {
			first = err
		}
	}
	s.mu.Lock()
	if charged {
		s.gateUntil = time.Now().Add(chargeWindow)
	} else if len(sync) > 0 {
		s.starting--
	}
	s.mu.Unlock()
	return first
}

// Return gives rs back (driver.Returner): each one's attempts and retry
// time are written to its run record before the server is asked to
// redeliver it (Nak), so that the next owner (another process, or this
// one restarted) hands it out with Attempt = Attempts+1 and NotBefore =
// its retry time. A record that cannot be written fails the call, and the
// message stays this process's until its lease runs out.
func (s *subscriptionDriver) Return(ctx context.Context, rs []driver.Returned) error {
	for _, r := range rs {
		d, err := deliveryOf(r.Message)
		if err != nil {
			return err
		}
		s.mu.Lock()
		if d.settled {
			s.mu.Unlock()
			continue
		}
		d.in.runs, d.starts = max(r.Attempts, 0), 0
		d.notBefore, d.returned = r.NotBefore, true
		s.mu.Unlock()
		if err := s.record(ctx, d); err != nil {
			return fmt.Errorf("nats: return %q: %w", r.Message.ID, err)
		}
		s.mu.Lock()
		err = s.settle(d)
		s.mu.Unlock()
		if err == nil {
			err = d.in.msg.Nak()
		}
		if err != nil {
			return fmt.Errorf("nats: return %q: %w", r.Message.ID, err)
		}
	}
	return nil
}
