package memory

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/groupq"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/internal/slab"
	"github.com/keyorder/keyorder/policy"
)

// entry is one message on one subscription.
type entry struct {
	msg      driver.Message
	attempts int
	// InProcess bookkeeping. due: returned with a retry time
	// (Return); the key waits for it until then.
	seq   uint64
	acked bool
	lease *lease
	due   time.Time
	// first is the lease of the first delivery, allocated with the entry
	// (most messages are delivered once). A later delivery allocates its
	// own: a lease is never reused, so a Message of an earlier delivery
	// can never settle a later one.
	first     lease
	firstUsed bool
}

type lease struct {
	id       uint64
	e        *entry
	h        groupq.Handle[*entry] // Native
	deadline time.Time
	// msg is the delivered copy; its AckID is the lease itself (one
	// allocation per delivery, and no boxing of an id).
	msg driver.Message
	// prev is the member of the same chain (Native: messages of one key
	// handed out by one receive) taken just before this one; nil for a
	// chain's first. nacked: settled by Nack. Together they tell which
	// member of an expired chain may have been running (see lostCounts).
	prev   *lease
	nacked bool
}

// leaseOf returns m's lease if it is still held.
func (s *subscription) leaseOf(m *driver.Message) (*lease, bool) {
	l, _ := m.AckID.(*lease)
	if l == nil || s.leases[l.id] != l {
		return nil, false
	}
	return l, true
}

// ikey is one key's log in an InProcess subscription: its unacknowledged
// messages (and acknowledged ones behind an unacknowledged one), oldest
// first; log[:delivered] have been handed to owner.
type ikey struct {
	log       []*entry
	delivered int
	owner     int
}

type subscription struct {
	name, topic string
	cfg         SubscriptionOptions

	mu sync.Mutex
	// waiting holds the wake-up channel of each receiver waiting for a
	// change, free the channels kept for reuse (see wait).
	waiting, free []chan struct{}
	nextLease     uint64
	leases        map[uint64]*lease
	consumers     int
	dead          []driver.DeadLetter

	q *groupq.Queue[*entry] // Native

	// faults is the FailSettlements hook, nil for none.
	faults atomic.Pointer[func(op memhook.Op, ms []*driver.Message) memhook.Fault]

	seq     uint64 // InProcess
	pending []*entry
	keys    map[string]*ikey
	dues    int // pending entries with a due time

	entries  slab.Slab[entry] // entrySlab at a time; s.mu held
	payloads slab.Bytes       // deliveries' payload copies; s.mu held
}

func newSubscription(name, topic string, cfg SubscriptionOptions) *subscription {
	s := &subscription{
		name: name, topic: topic, cfg: cfg,
		leases:   map[uint64]*lease{},
		entries:  slab.New[entry](entrySlab),
		payloads: slab.NewBytes(payloadChunk),
	}
	if cfg.Hold == Native {
		s.q = groupq.New[*entry](cfg.Ordering)
	} else {
		s.keys = map[string]*ikey{}
	}
	return s
}

func (s *subscription) newConsumer() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.consumers++
	return s.consumers
}

// signal wakes waiting receivers; s.mu is held.
func (s *subscription) signal() {
	for _, ch := range s.waiting {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	clear(s.waiting)
	s.waiting = s.waiting[:0]
}

// wait registers a receiver's wake-up channel, which the next signal
// wakes; s.mu is held. Channels are reused (see unwait), so waiting
// allocates nothing once the receivers have theirs.
func (s *subscription) wait() chan struct{} {
	var ch chan struct{}
	if n := len(s.free); n > 0 {
		ch = s.free[n-1]
		s.free[n-1] = nil
		s.free = s.free[:n-1]
	} else {
		ch = make(chan struct{}, 1)
	}
	s.waiting = append(s.waiting, ch)
	return ch
}

// unwait withdraws ch, registered by wait, and keeps it for reuse; s.mu is
// held. Once withdrawn no signal can reach ch, so emptying it here leaves
// it clean for its next waiter.
func (s *subscription) unwait(ch chan struct{}) {
	if i := slices.Index(s.waiting, ch); i >= 0 {
		s.waiting = slices.Delete(s.waiting, i, i+1)
	}
	select {
	case <-ch:
	default:
	}
	s.free = append(s.free, ch)
}

// enqueue adds ms, whose payloads and headers the topic copied into cp
// (cp[i] is ms[i]'s).
func (s *subscription) enqueue(ms []*driver.Message, cp []stored, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, m := range ms {
		e := s.entries.Next()
		e.msg = driver.Message{
			ID: m.ID, Key: m.Key, Payload: cp[i].payload, Headers: cp[i].headers,
			NotBefore: m.NotBefore, PublishTime: now,
		}
		s.add(e)
	}
	s.signal()
}

// entrySlab is how many entries one allocation holds. Entries are
// allocated entrySlab at a time (a publisher often hands over one message
// per call): a slab's memory, and the payloads of its settled entries, live
// until none of its entries is referenced any more (see internal/slab).
const entrySlab = 64

func (s *subscription) add(e *entry) {
	if s.q != nil {
		s.q.Push(groupq.Item[*entry]{Key: e.msg.Key, Keyed: e.msg.Key != "", At: e.msg.NotBefore, Value: e})
		return
	}
	s.seq++
	e.seq = s.seq
	s.pending = append(s.pending, e)
	if e.msg.Key != "" {
		k := s.keys[e.msg.Key]
		if k == nil {
			k = &ikey{}
			s.keys[e.msg.Key] = k
		}
		k.log = append(k.log, e)
	}
}

// receive waits for deliverable messages; it returns memhook.ErrCrashed
// once crash is closed.
func (s *subscription) receive(ctx context.Context, consumer, max int, crash <-chan struct{}) ([]*driver.Message, error) {
	if max <= 0 || max > s.cfg.MaxBatch {
		max = s.cfg.MaxBatch
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	var ch chan struct{} // registered by wait while this receiver waits
	defer func() {
		if ch != nil {
			s.mu.Lock()
			s.unwait(ch)
			s.mu.Unlock()
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s.mu.Lock()
		if ch != nil {
			s.unwait(ch)
			ch = nil
		}
		select {
		case <-crash:
			s.mu.Unlock()
			return nil, memhook.ErrCrashed
		default:
		}
		now := time.Now()
		s.expire(now)
		out := s.take(consumer, max, now)
		if len(out) > 0 {
			s.mu.Unlock()
			return out, nil
		}
		wake, ok := s.nextWake()
		ch = s.wait()
		s.mu.Unlock()
		var tc <-chan time.Time
		if ok {
			d := wake.Sub(now)
			if timer == nil {
				timer = time.NewTimer(d)
			} else {
				timer.Reset(d)
			}
			tc = timer.C
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-crash:
			return nil, memhook.ErrCrashed
		case <-ch:
		case <-tc:
		}
	}
}

func (s *subscription) newLease(e *entry, h groupq.Handle[*entry], prev *lease, now time.Time) *driver.Message {
	e.attempts++
	s.nextLease++
	var l *lease
	if !e.firstUsed {
		e.firstUsed = true
		l = &e.first
	} else {
		l = new(lease)
	}
	*l = lease{id: s.nextLease, e: e, h: h, deadline: now.Add(s.cfg.Lease), msg: e.msg, prev: prev}
	s.leases[l.id] = l
	e.lease = l
	// Each delivery gets its own payload: what a consumer writes into it
	// reaches neither the stored message (a redelivery, a dead letter) nor
	// another subscription's or consumer's delivery.
	l.msg.Payload = s.payloads.Copy(e.msg.Payload)
	l.msg.AckID = l
	l.msg.Attempt = e.attempts
	l.msg.Copy = e // a redrive makes a new entry
	return &l.msg
}

func (s *subscription) take(consumer, max int, now time.Time) []*driver.Message {
	// One allocation for the result, sized by what may be taken.
	waiting := len(s.pending)
	if s.q != nil {
		waiting = s.q.Len()
	}
	var out []*driver.Message
	if n := min(max, waiting); n > 0 {
		out = make([]*driver.Message, 0, n)
	}
	if s.q != nil {
		for len(out) < max {
			h, ok := s.q.Pop(now)
			if !ok {
				break
			}
			out = append(out, s.newLease(h.Item.Value, h, nil, now))
			for c := 1; c < s.cfg.Chain && len(out) < max; c++ {
				if h, ok = s.q.PopNext(h, now); !ok {
					break
				}
				prev := out[len(out)-1].AckID.(*lease)
				out = append(out, s.newLease(h.Item.Value, h, prev, now))
			}
		}
		return out
	}
	kept := s.pending[:0]
	var waits map[string]bool // keys whose first pending entry is not due
	for _, e := range s.pending {
		if len(out) >= max {
			kept = append(kept, e)
			continue
		}
		if s.dues > 0 && e.msg.Key != "" && waits[e.msg.Key] {
			kept = append(kept, e)
			continue
		}
		if !e.due.IsZero() {
			if e.due.After(now) {
				if waits == nil {
					waits = map[string]bool{}
				}
				waits[e.msg.Key] = true
				kept = append(kept, e)
				continue
			}
			e.due = time.Time{}
			s.dues--
		}
		if e.msg.Key != "" {
			k := s.keys[e.msg.Key]
			if k.owner != 0 && k.owner != consumer {
				kept = append(kept, e)
				continue
			}
			k.owner = consumer
			k.delivered++
		}
		out = append(out, s.newLease(e, groupq.Handle[*entry]{}, nil, now))
	}
	clear(s.pending[len(kept):])
	s.pending = kept
	return out
}

func (s *subscription) nextWake() (time.Time, bool) {
	var wake time.Time
	ok := false
	if s.q != nil {
		wake, ok = s.q.NextWake()
	}
	for _, l := range s.leases {
		if !ok || l.deadline.Before(wake) {
			wake, ok = l.deadline, true
		}
	}
	if s.dues > 0 {
		for _, e := range s.pending {
			if !e.due.IsZero() && (!ok || e.due.Before(wake)) {
				wake, ok = e.due, true
			}
		}
	}
	return wake, ok
}

// expire returns messages whose lease ran out. The claim counted an attempt
// for each; it stands only for a message that may have been running when
// the lease was lost (lostCounts), as PostgreSQL counts (its migration
// 002): the others are given back as not run.
func (s *subscription) expire(now time.Time) {
	var expired []*lease
	for _, l := range s.leases {
		if !l.deadline.After(now) {
			expired = append(expired, l)
		}
	}
	if len(expired) == 0 {
		return
	}
	// Decided for all before any is given back: giving one back changes
	// what is held.
	counted := make([]bool, len(expired))
	for i, l := range expired {
		counted[i] = s.lostCounts(l)
	}
	for i, l := range expired {
		if s.leases[l.id] != l {
			continue // given back with an earlier one of its key (InProcess)
		}
		s.retry(l, time.Time{}, counted[i], !s.ordered())
	}
}

// ordered reports whether the subscription is Ordered.
func (s *subscription) ordered() bool { return s.cfg.Ordering == policy.Ordered }

// lostCounts reports whether the loss of l's lease counts an attempt: whether
// its message may have been running (driver.Message.Attempt). Under
// Ordered only the first unsettled message of a key's chain may have been,
// and none behind a message nacked under the same chain; under Exclusive
// the first unsettled one of a chain (a nacked one is settled, and later
// ones run after it). InProcess, the broker cannot see chains: under
// Ordered it counts for the first unacknowledged delivered message of the
// key. Everything else counts: any of it may have been running.
func (s *subscription) lostCounts(l *lease) bool {
	if s.q == nil {
		e := l.e
		if !s.ordered() || e.msg.Key == "" {
			return true
		}
		k := s.keys[e.msg.Key]
		return k == nil || len(k.log) == 0 || k.log[0] == e
	}
	if s.cfg.Ordering == policy.Parallel {
		return true
	}
	for p := l.prev; p != nil; p = p.prev {
		if s.leases[p.id] == p || (p.nacked && s.ordered()) {
			return false
		}
	}
	return true
}

func (s *subscription) settle(ms []*driver.Message, fn func(l *lease, now time.Time)) error {
	return s.settleOrder(ms, false, fn)
}

// settleOrder settles ms, last first if backwards.
func (s *subscription) settleOrder(ms []*driver.Message, backwards bool, fn func(l *lease, now time.Time)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var err error
	for i := range ms {
		m := ms[i]
		if backwards {
			m = ms[len(ms)-1-i]
		}
		l, ok := s.leaseOf(m)
		if !ok {
			if err == nil {
				err = errNoLease
			}
			continue
		}
		fn(l, now)
	}
	s.signal()
	return err
}

func (s *subscription) dropLease(l *lease) {
	delete(s.leases, l.id)
	if l.e.lease == l {
		l.e.lease = nil
	}
}

func (s *subscription) ack(l *lease) {
	s.dropLease(l)
	if s.q != nil {
		s.q.Done(l.h)
		return
	}
	e := l.e
	e.acked = true
	if e.msg.Key == "" {
		return
	}
	k := s.keys[e.msg.Key]
	n := 0
	for n < k.delivered && k.log[n].acked {
		n++
	}
	clear(k.log[:n])
	k.log = k.log[n:]
	k.delivered -= n
	if k.delivered == 0 {
		k.owner = 0
	}
	if len(k.log) == 0 {
		delete(s.keys, e.msg.Key)
	}
}

// retry returns a leased message: at its retry time (Native), or at once
// with every later delivered message of its key (InProcess, as Pub/Sub
// redelivers). counted says whether the claim counts as an attempt, and
// laterCounted (InProcess) whether it counts for the later messages
// returned with it.
func (s *subscription) retry(l *lease, at time.Time, counted, laterCounted bool) {
	s.dropLease(l)
	e := l.e
	if !counted {
		e.attempts--
	}
	if s.q != nil {
		s.q.Retry(l.h, at)
		return
	}
	back := []*entry{e}
	if e.msg.Key != "" {
		k := s.keys[e.msg.Key]
		i := slices.Index(k.log, e)
		for _, o := range k.log[i+1 : k.delivered] {
			if o.lease != nil {
				s.dropLease(o.lease)
				if !laterCounted {
					o.attempts-- // returned unrun with e
				}
			}
			o.acked = false
			back = append(back, o)
		}
		k.delivered = i
		if i == 0 {
			k.owner = 0
		}
	}
	s.pending = append(s.pending, back...)
	slices.SortFunc(s.pending, func(a, b *entry) int { return cmp.Compare(a.seq, b.seq) })
	s.pending = slices.Compact(s.pending)
}

// giveBackCounted returns rs, last first, each counted as its Attempts and
// deliverable not before its NotBefore (Return).
func (s *subscription) giveBackCounted(rs []driver.Returned) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	for i := len(rs) - 1; i >= 0; i-- {
		r := rs[i]
		l, ok := s.leaseOf(r.Message)
		if !ok {
			if err == nil {
				err = errNoLease
			}
			continue
		}
		e := l.e
		s.retry(l, r.NotBefore, true, false)
		e.attempts = max(r.Attempts, 0)
		if s.q == nil && !r.NotBefore.IsZero() {
			if e.due.IsZero() {
				s.dues++
			}
			e.due = r.NotBefore
		}
	}
	s.signal()
	return err
}

func (s *subscription) extend(ms []*driver.Message) []*driver.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	s.expire(now)
	var lost []*driver.Message
	for _, m := range ms {
		if l, ok := s.leaseOf(m); ok {
			l.deadline = now.Add(s.cfg.Lease)
		} else {
			lost = append(lost, m)
		}
	}
	return lost
}

func (s *subscription) deadLetter(l *lease, reason string, attempts int, now time.Time) {
	s.dead = append(s.dead, driver.DeadLetter{Message: l.e.msg, Reason: reason, Attempts: attempts, DeadAt: now})
	s.ack(l)
}

func (s *subscription) deadLetters(limit int) []driver.DeadLetter {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.dead)
	if limit > 0 && limit < n {
		n = limit
	}
	return slices.Clone(s.dead[:n])
}

// redrive re-enqueues the dead letters with these IDs and returns the IDs
// of those it redrove.
func (s *subscription) redrive(ids []string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var done []string
	s.dead = slices.DeleteFunc(s.dead, func(d driver.DeadLetter) bool {
		if !slices.Contains(ids, d.Message.ID) {
			return false
		}
		m := d.Message
		m.NotBefore = time.Time{}
		s.add(&entry{msg: m})
		done = append(done, m.ID)
		return true
	})
	if len(done) > 0 {
		s.signal()
	}
	return done
}
