package sqs

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/driverkit"
	"github.com/keyorder/keyorder/policy"
)

// subscriptionDriver is the driver.Subscription driver of one consumer of a
// FIFO queue.
type subscriptionDriver struct {
	client   *sqs.Client
	queueURL string
	deadName string
	ordering policy.Ordering
	lease    time.Duration
	wait     time.Duration
	book     *book
	log      *slog.Logger

	oldestFirst bool
	// backlog: the last Receive got all it asked for, so the next one
	// asks for all at once (receiveAll) rather than one call first.
	backlog atomic.Bool

	// starts records handler starts (Options.StartStore); nil without
	// a store.
	starts *driverkit.StartLog

	mu      sync.Mutex
	closed  bool
	deadURL string
}

var (
	_ driver.Subscription    = (*subscriptionDriver)(nil)
	_ driver.DeadLetterStore = (*subscriptionDriver)(nil)
	_ driver.Returner        = (*subscriptionDriver)(nil)
)

var errClosed = errors.New("sqs: subscription driver closed")

// delivery is a received message's AckID.
type delivery struct {
	receipt string
	sqsID   string
	group   string
	body    string
	attrs   map[string]types.MessageAttributeValue
	seq     string               // SequenceNumber, a decimal
	prior   int                  // attempts carried from before a requeue
	mark    *driverkit.StartMark // with a start store
}

// openSubscription returns a consuming driver for the FIFO queue at
// queueURL. opts.Ordering must match the queue's keyorder-ordering tag;
// opts.Lease is the lease and opts.WaitTime the long-poll wait. The
// client stays the caller's.
func openSubscription(ctx context.Context, client *sqs.Client, queueURL string, opts *Options) (*subscriptionDriver, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: sqs.OpenSubscription: nil client", keyorder.ErrInvalidConfig)
	}
	o := opts.withDefaults()
	dead, err := deadQueueName(queueNameOf(queueURL))
	if err != nil {
		return nil, err
	}
	if _, err := queueOrdering(ctx, client, queueURL, &o.Ordering); err != nil {
		return nil, err
	}
	s := &subscriptionDriver{
		client: client, queueURL: queueURL, deadName: dead,
		ordering: o.Ordering, lease: o.Lease, wait: o.WaitTime,
		book: &book{n: map[string]int{}}, log: o.Logger, oldestFirst: o.OldestFirst,
	}
	if o.StartStore != nil {
		s.starts = driverkit.NewStartLog(o.StartStore, queueURL, o.Logger, 0)
	}
	return s, nil
}

// book counts, per SQS message ID, the put-backs this driver made of a
// message received as its group's head (Release, OldestFirst's surplus):
// receives that were not attempts and that no other process can tell from
// one. It remembers the last bookMax messages.
type book struct {
	mu    sync.Mutex
	n     map[string]int
	order []string
	next  int
}

const bookMax = 100_000

func (b *book) add(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.n[id]; !ok {
		if len(b.order) < bookMax {
			b.order = append(b.order, id)
		} else {
			delete(b.n, b.order[b.next])
			b.order[b.next] = id
			b.next = (b.next + 1) % bookMax
		}
	}
	b.n[id]++
}

func (b *book) get(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n[id]
}

func (b *book) forget(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.n, id) // its slot in order is reused when it comes round
}

func (s *subscriptionDriver) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// receiveTimeout bounds one ReceiveMessage call beyond its wait.
const receiveTimeout = 15 * time.Second

// Receive long-polls until at least one message is deliverable or ctx is
// done, and returns up to maxMessages (at most 10). A poll in flight is not
// cancelled by ctx (see the package documentation); messages it brings
// after ctx ended are returned together with ctx's error.
//
// The first ReceiveMessage call asks for up to 10 (with OldestFirst, for
// 10, see fit); a group's messages in it come consecutively, as a chain.
// When it returns all it asked for and more were asked for (up to
// receiveFanout*10, without OldestFirst), the rest is asked for at once by
// further calls without wait, 10 each: SQS hands out nothing of a group
// with a message in flight, so their groups are not the first call's (a
// group's chain is never split), and one Receive is not bound to one
// round trip per 10 messages. When the previous Receive got all it asked
// for (a backlog), all the calls are made at once, the first with the
// wait: the subscriber receives from one goroutine, so the first call's
// round trip before the others would halve what it receives per round
// trip.
// Under Ordered the subscriber holds a chain whose member failed in
// process (Capabilities.HoldChains), so the chain's later messages are not
// put back unrun, which would count as an attempt wherever they are
// received next (see attempt).
func (s *subscriptionDriver) Receive(ctx context.Context, maxMessages int) ([]*driver.Message, error) {
	maxMessages = min(max(maxMessages, 1), s.maxBatch())
	first := min(maxMessages, MaxBatchMessages)
	for {
		if s.isClosed() {
			return nil, errClosed
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		wait := s.wait
		if dl, ok := ctx.Deadline(); ok {
			wait = min(wait, max(time.Until(dl).Truncate(time.Second), 0))
		}
		// OldestFirst asks for a full batch: SQS does not hand out groups
		// oldest first, so Receive chooses the oldest heads itself (see fit).
		ask := first
		if s.oldestFirst {
			ask = MaxBatchMessages
		}
		var raw []types.Message
		var err error
		if !s.oldestFirst && maxMessages > first && s.backlog.Load() {
			// The last Receive found a backlog: ask for all at once.
			raw, err = s.receiveAll(ctx, maxMessages, wait)
		} else {
			raw, err = s.receiveRaw(ctx, s.queueURL, ask, wait, s.lease)
			if err == nil && len(raw) == first && maxMessages > first {
				raw = append(raw, s.receiveMore(ctx, maxMessages-first)...)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err
		}
		if !s.oldestFirst {
			s.backlog.Store(len(raw) == maxMessages)
		}
		ms := s.fit(s.admit(raw), maxMessages)
		if s.starts != nil {
			s.resolveRuns(ctx, ms)
		}
		if len(ms) > 0 {
			return ms, ctx.Err()
		}
		if wait == 0 {
			t := time.NewTimer(100 * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C:
			}
		}
	}
}

// receiveFanout is how many ReceiveMessage calls one Receive may make at
// once (Capabilities.MaxBatch is receiveFanout*10), without OldestFirst.
const receiveFanout = 4

// maxBatch is the most messages one Receive returns.
func (s *subscriptionDriver) maxBatch() int {
	if s.oldestFirst {
		return MaxBatchMessages
	}
	return receiveFanout * MaxBatchMessages
}

// receiveMore receives up to n more messages without waiting, in calls of
// up to 10 made at once. A failing call is logged (what SQS chose for it,
// if anything, comes back after the visibility timeout); the messages of
// the others are returned.
func (s *subscriptionDriver) receiveMore(ctx context.Context, n int) []types.Message {
	var mu sync.Mutex
	var out []types.Message
	var wg sync.WaitGroup
	for ; n > 0; n -= MaxBatchMessages {
		ask := min(n, MaxBatchMessages)
		wg.Go(func() {
			raw, err := s.receiveRaw(ctx, s.queueURL, ask, 0, s.lease)
			if err != nil {
				s.log.Warn("keyorder sqs: receive failed; the other calls' messages are returned", "queue", s.queueURL, "err", err)
				return
			}
			mu.Lock()
			out = append(out, raw...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// receiveAll receives up to n messages in calls of up to 10 made at once,
// the first waiting up to wait. It fails only when every call failed; a
// failing call among others is logged, as in receiveMore.
func (s *subscriptionDriver) receiveAll(ctx context.Context, n int, wait time.Duration) ([]types.Message, error) {
	var mu sync.Mutex
	var out []types.Message
	var errs []error
	var wg sync.WaitGroup
	for i := 0; n > 0; i, n = i+1, n-MaxBatchMessages {
		ask, w := min(n, MaxBatchMessages), time.Duration(0)
		if i == 0 {
			w = wait
		}
		wg.Go(func() {
			raw, err := s.receiveRaw(ctx, s.queueURL, ask, w, s.lease)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			out = append(out, raw...)
		})
	}
	wg.Wait()
	if len(out) == 0 && len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if len(errs) > 0 {
		s.log.Warn("keyorder sqs: receive failed; the other calls' messages are returned", "queue", s.queueURL, "err", errors.Join(errs...))
	}
	return out, nil
}

func (s *subscriptionDriver) receiveRaw(ctx context.Context, queueURL string, n int, wait, vis time.Duration) ([]types.Message, error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wait+receiveTimeout)
	defer cancel()
	out, err := s.client.ReceiveMessage(rctx, &sqs.ReceiveMessageInput{
		QueueUrl:            aws.String(queueURL),
		MaxNumberOfMessages: int32(n),
		WaitTimeSeconds:     int32(wait / time.Second),
		VisibilityTimeout:   seconds(vis),
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{
			types.MessageSystemAttributeNameApproximateReceiveCount,
			types.MessageSystemAttributeNameSentTimestamp,
			types.MessageSystemAttributeNameMessageGroupId,
			types.MessageSystemAttributeNameSequenceNumber,
			types.MessageSystemAttributeNameApproximateFirstReceiveTimestamp,
			types.MessageSystemAttributeNameMessageDeduplicationId,
		},
		MessageAttributeNames: []string{"All"},
		// An SDK retry of this call returns the same messages (see client).
		ReceiveRequestAttemptId: aws.String(randomID()),
	})
	if err != nil {
		return nil, fmt.Errorf("sqs: receive from %s: %w", queueURL, err)
	}
	return out.Messages, nil
}

func groupOf(m *driver.Message) string { return m.AckID.(*delivery).group }

// admit decodes received messages, holds those whose not-before time is
// more than a second away (and puts back their groups' later messages), and
// returns the rest with each group's messages consecutive, in order. What it
// cannot hand back (a failed hold or put-back) it logs: the messages then
// stay in flight until their visibility timeout, holding their groups.
func (s *subscriptionDriver) admit(raw []types.Message) []*driver.Message {
	now := time.Now()
	held := map[string]bool{}
	seen := map[string]bool{}
	var out, back []*driver.Message
	for i := range raw {
		g := raw[i].Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]
		m := s.decode(&raw[i], seen[g])
		seen[g] = true
		switch {
		case held[g]:
			back = append(back, m)
		case m.NotBefore.Sub(now) > time.Second:
			held[g] = true
			d := m.AckID.(*delivery)
			ctx, cancel := context.WithTimeout(context.Background(), receiveTimeout)
			// Holding it in flight holds its group. If the call fails, the
			// message stays in flight for the lease and comes back then.
			// The hold is not an attempt: decode recognises the receive
			// as early by its ApproximateFirstReceiveTimestamp.
			_, err := s.client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
				QueueUrl: aws.String(s.queueURL), ReceiptHandle: aws.String(d.receipt),
				VisibilityTimeout: seconds(time.Until(m.NotBefore)),
			})
			cancel()
			if err != nil {
				s.log.Warn("keyorder sqs: holding a message until its not-before time failed; it comes back after the visibility timeout",
					"queue", s.queueURL, "id", m.ID, "err", err)
			}
		default:
			out = append(out, m)
		}
	}
	if len(back) > 0 {
		s.putBack(back, "behind a held message")
	}
	return groupOrder(out)
}

// putBack releases messages the subscriber never saw, logging a failure.
func (s *subscriptionDriver) putBack(ms []*driver.Message, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), receiveTimeout)
	defer cancel()
	if err := s.Release(ctx, ms); err != nil {
		s.log.Warn("keyorder sqs: putting back received messages failed; they come back after the visibility timeout",
			"queue", s.queueURL, "why", why, "count", len(ms), "err", err)
	}
}

// groupOrder makes each group's messages consecutive (groups in order of
// first appearance), each group's in SequenceNumber order (one call returns
// them so; the calls of one Receive never share a group, but should they,
// the group still comes in order).
func groupOrder(ms []*driver.Message) []*driver.Message {
	first := map[string]int{}
	for i, m := range ms {
		if _, ok := first[groupOf(m)]; !ok {
			first[groupOf(m)] = i
		}
	}
	slices.SortStableFunc(ms, func(a, b *driver.Message) int {
		if c := cmp.Compare(first[groupOf(a)], first[groupOf(b)]); c != 0 {
			return c
		}
		return compareSeq(a.AckID.(*delivery).seq, b.AckID.(*delivery).seq)
	})
	return ms
}

// compareSeq orders two SequenceNumbers (decimals of any length).
func compareSeq(a, b string) int {
	if c := cmp.Compare(len(a), len(b)); c != 0 {
		return c
	}
	return strings.Compare(a, b)
}

// fit chooses at most n of ms (grouped by groupOrder): the oldest group
// heads first, by SequenceNumber, then their chain tails in order while
// room is left; it puts the rest back. A chain tail thus never takes the
// place of another group's head, and groups go oldest first as far as one
// receive shows them.
func (s *subscriptionDriver) fit(ms []*driver.Message, n int) []*driver.Message {
	if len(ms) == 0 {
		return ms
	}
	type chain struct{ ms []*driver.Message }
	var chains []*chain
	byGroup := map[string]*chain{}
	for _, m := range ms {
		g := groupOf(m)
		c := byGroup[g]
		if c == nil {
			c = &chain{}
			byGroup[g] = c
			chains = append(chains, c)
		}
		c.ms = append(c.ms, m)
	}
	slices.SortStableFunc(chains, func(a, b *chain) int {
		return compareSeq(a.ms[0].AckID.(*delivery).seq, b.ms[0].AckID.(*delivery).seq)
	})
	take := make([]int, len(chains))
	room := n
	for i := range chains {
		if room > 0 {
			take[i] = 1
			room--
		}
	}
	for i, c := range chains {
		if take[i] == 0 {
			continue
		}
		extra := min(room, len(c.ms)-1)
		take[i] += extra
		room -= extra
	}
	out := make([]*driver.Message, 0, n)
	var back []*driver.Message
	for i, c := range chains {
		out = append(out, c.ms[:take[i]]...)
		back = append(back, c.ms[take[i]:]...)
	}
	if len(back) > 0 {
		s.putBack(back, "surplus of an oldest-first receive")
	}
	return out
}

// decode converts a received message. tail reports that an earlier message
// of its group came in the same receive (see attempt).
func (s *subscriptionDriver) decode(rm *types.Message, tail bool) *driver.Message {
	d := &delivery{
		receipt: aws.ToString(rm.ReceiptHandle),
		sqsID:   aws.ToString(rm.MessageId),
		group:   rm.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)],
		body:    aws.ToString(rm.Body),
		attrs:   rm.MessageAttributes,
		seq:     rm.Attributes[string(types.MessageSystemAttributeNameSequenceNumber)],
	}
	m := &driver.Message{AckID: d, Payload: []byte(d.body)}
	for k, v := range rm.MessageAttributes {
		switch k {
		case AttrID:
			m.ID = attrString(v)
		case AttrKey:
			m.Key = attrString(v)
		case AttrNotBefore:
			m.NotBefore, _ = time.Parse(time.RFC3339Nano, attrString(v))
		case AttrEncoding:
			if attrString(v) == "base64" {
				if p, err := base64.StdEncoding.DecodeString(d.body); err == nil {
					m.Payload = p
				}
			}
		case AttrReason, AttrAttempts, AttrDeadAt:
		default:
			if v.StringValue != nil || v.BinaryValue != nil {
				if m.Headers == nil {
					m.Headers = map[string]string{}
				}
				m.Headers[k] = attrString(v)
			}
		}
	}
	if m.ID == "" {
		m.ID = d.sqsID
	}
	m.Copy = d.sqsID // a redrive sends a new message
	m.Attempt = s.attempt(rm, m, tail)
	if s.starts != nil {
		d.prior, _ = strconv.Atoi(attrString(rm.MessageAttributes[AttrAttempts]))
		d.mark = &driverkit.StartMark{ID: d.sqsID, Earlier: s.receives(rm, m) - 1}
	}
	if ms, err := strconv.ParseInt(rm.Attributes[string(types.MessageSystemAttributeNameSentTimestamp)], 10, 64); err == nil {
		m.PublishTime = time.UnixMilli(ms)
	}
	return m
}

// attempt computes a received message's Message.Attempt: the attempts it
// carries from before a requeue (keyorder-attempts), plus this one, plus the
// earlier receives of this copy that were attempts. SQS counts every receive
// (ApproximateReceiveCount) and keeps nothing else a process could write
// without moving the message to the end of its group, so the earlier
// receives that were not attempts are recognised from what the receive
// itself shows:
//
//   - A tail under Ordered (an earlier message of its group came in the
//     same receive): none of its earlier receives was an attempt. Each of
//     them returned a prefix of the group, so it included that earlier
//     message, which is still in the queue: it was neither acknowledged nor
//     dead-lettered then, and under Ordered nothing behind an unsettled
//     message runs. Those receives were put-backs behind a failed or held
//     head, or the leases of a process that stopped or crashed while the
//     head was unsettled (a lost lease counts for the head only).
//   - A receive more than a second before the message's not-before time
//     was a hold, never an attempt; the first receive's time is known
//     (ApproximateFirstReceiveTimestamp).
//   - The put-backs this driver made itself (its book).
//
// Every other earlier receive counts: a failed attempt (Nack), or a lost
// lease of a message that may have been running. What stays uncounted by
// this rule is a group head put back unrun by another process (a graceful
// shutdown's pending messages, an OldestFirst surplus): see Delivery
// semantics in the package documentation.
func (s *subscriptionDriver) attempt(rm *types.Message, m *driver.Message, tail bool) int {
	prior, _ := strconv.Atoi(attrString(rm.MessageAttributes[AttrAttempts])) // attempts before a requeue
	if tail && s.ordering == policy.Ordered {
		return prior + 1
	}
	return prior + max(s.receives(rm, m), 1)
}

// receives returns how many receives of rm's copy (this one included) may
// have been attempts: ApproximateReceiveCount less the not-before hold and
// this driver's own put-backs (see attempt).
func (s *subscriptionDriver) receives(rm *types.Message, m *driver.Message) int {
	n, _ := strconv.Atoi(rm.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)])
	n -= s.book.get(m.AckID.(*delivery).sqsID)
	if !m.NotBefore.IsZero() {
		if ms, err := strconv.ParseInt(rm.Attributes[string(types.MessageSystemAttributeNameApproximateFirstReceiveTimestamp)], 10, 64); err == nil &&
			m.NotBefore.Sub(time.UnixMilli(ms)) > time.Second {
			n--
		}
	}
	return n
}

// ackFanout is how many DeleteMessageBatch calls one Ack makes at once.
const ackFanout = 8

// Ack deletes messages with DeleteMessageBatch, up to ackFanout calls of
// 10 at once: the subscriber acknowledges from one goroutine, so calls
// made one after another would bound consumption to 10 messages per
// round trip.
func (s *subscriptionDriver) Ack(ctx context.Context, ms []*driver.Message) error {
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	sem := make(chan struct{}, ackFanout)
	for start := 0; start < len(ms); start += MaxBatchMessages {
		chunk := ms[start:min(start+MaxBatchMessages, len(ms))]
		entries := make([]types.DeleteMessageBatchRequestEntry, len(chunk))
		for i, m := range chunk {
			d := m.AckID.(*delivery)
			entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(d.receipt)}
			s.book.forget(d.sqsID)
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out, err := s.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(s.queueURL), Entries: entries})
			if err == nil && len(out.Failed) > 0 {
				err = batchError("delete", out.Failed)
			} else if err != nil {
				err = fmt.Errorf("sqs: delete from %s: %w", s.queueURL, err)
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) == 0 {
		s.settled(ms)
	}
	return errors.Join(errs...)
}

// Nack returns a failed message to be redelivered not before delay.
//
// Under Ordered (and Parallel, where each message is its own group) it
// makes m visible again after delay (rounded up to whole seconds, at most
// 12h); until then its group stays blocked. The receive counted the
// attempt.
//
// Under Exclusive, where later messages may overtake a failed one, it
// sends a copy of m to the end of its group, carrying the attempts made
// (keyorder-attempts) and the retry time as its not-before time, and then
// deletes m: the group's later messages run meanwhile, and the copy is
// held when it is received early. If the delete fails after the copy was
// sent, m comes back too (at least once).
func (s *subscriptionDriver) Nack(ctx context.Context, m *driver.Message, delay time.Duration) error {
	d := m.AckID.(*delivery)
	if s.ordering == policy.Exclusive && m.Key != "" {
		return s.requeue(ctx, m, delay)
	}
	s.flushRuns(ctx, m)
	_, err := s.client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl: aws.String(s.queueURL), ReceiptHandle: aws.String(d.receipt),
		VisibilityTimeout: seconds(delay),
	})
	if err != nil {
		return fmt.Errorf("sqs: nack: %w", err)
	}
	return nil
}

func (s *subscriptionDriver) requeue(ctx context.Context, m *driver.Message, delay time.Duration) error {
	d := m.AckID.(*delivery)
	attrs := make(map[string]types.MessageAttributeValue, len(d.attrs)+2)
	for k, v := range d.attrs {
		attrs[k] = v
	}
	attrs[AttrAttempts] = stringAttr(strconv.Itoa(m.Attempt))
	attrs[AttrNotBefore] = stringAttr(time.Now().Add(delay).UTC().Format(time.RFC3339Nano))
	if _, ok := attrs[AttrID]; !ok {
		attrs[AttrID] = stringAttr(m.ID)
	}
	if _, err := s.client.SendMessage(ctx, &sqs.SendMessageInput{
		QueueUrl: aws.String(s.queueURL), MessageBody: aws.String(d.body), MessageAttributes: attrs,
		MessageGroupId:         aws.String(d.group),
		MessageDeduplicationId: aws.String(dedupID(m.ID + "/retry/" + randomID())),
	}); err != nil {
		return fmt.Errorf("sqs: nack %s (requeue): %w", m.ID, err)
	}
	if _, err := s.client.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(s.queueURL), ReceiptHandle: aws.String(d.receipt)}); err != nil {
		return fmt.Errorf("sqs: nack %s: requeued, but deleting the original failed (it will be delivered again): %w", m.ID, err)
	}
	s.book.forget(d.sqsID)
	s.settled([]*driver.Message{m})
	return nil
}

// Return gives back messages that ran and wait for an in-process retry
// (driver.Returner), at a graceful stop.
//
// Under Ordered (and Parallel) each one becomes visible again after its
// remaining delay (ChangeMessageVisibility, rounded up to whole seconds, at
// most 12h): its group stays blocked until then, and its receive count,
// which counted the receive it ran under, is kept; the retries run in
// process since that receive are not carried (SQS keeps no count a process
// can write without moving the message to the end of its group).
//
// Under Exclusive, where a failed message goes to the end of its group
// anyway (see Nack), the copy sent there carries both: the attempts in
// keyorder-attempts and the due time as its not-before time.
func (s *subscriptionDriver) Return(ctx context.Context, rs []driver.Returned) error {
	var errs []error
	for _, r := range rs {
		delay := max(time.Until(r.NotBefore), 0)
		if s.ordering == policy.Exclusive && r.Message.Key != "" {
			m := *r.Message
			m.Attempt = r.Attempts
			if err := s.requeue(ctx, &m, delay); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		s.flushRuns(ctx, r.Message)
		_, err := s.client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
			QueueUrl: aws.String(s.queueURL), ReceiptHandle: aws.String(r.Message.AckID.(*delivery).receipt),
			VisibilityTimeout: seconds(delay),
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("sqs: return %s: %w", r.Message.ID, err))
		}
	}
	return errors.Join(errs...)
}

// Release makes messages visible again at once, in order, and records that
// their receive was not an attempt.
//
// It goes from the last message to the first: ElasticMQ hands out a
// group's visible message while a later one of the group is still in
// flight (only earlier ones in flight block it), so making the first
// visible first would let another consumer receive it alone, and the rest
// of its group separately, later.
func (s *subscriptionDriver) Release(ctx context.Context, ms []*driver.Message) error {
	rev := make([]*driver.Message, len(ms))
	for i, m := range ms {
		s.book.add(m.AckID.(*delivery).sqsID)
		rev[len(ms)-1-i] = m
	}
	_, err := s.changeVisibility(ctx, rev, 0)
	return err
}

// changeVisibility sets the visibility of ms in batches, in order, and
// returns the messages SQS refused as sender faults (not in flight, receipt
// handle invalid) and an error for the rest.
func (s *subscriptionDriver) changeVisibility(ctx context.Context, ms []*driver.Message, vis time.Duration) ([]*driver.Message, error) {
	var refused []*driver.Message
	var errs []error
	for start := 0; start < len(ms); start += MaxBatchMessages {
		chunk := ms[start:min(start+MaxBatchMessages, len(ms))]
		entries := make([]types.ChangeMessageVisibilityBatchRequestEntry, len(chunk))
		for i, m := range chunk {
			entries[i] = types.ChangeMessageVisibilityBatchRequestEntry{
				Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(m.AckID.(*delivery).receipt),
				VisibilityTimeout: seconds(vis),
			}
		}
		out, err := s.client.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(s.queueURL), Entries: entries})
		if err != nil {
			errs = append(errs, fmt.Errorf("sqs: change visibility: %w", err))
			continue
		}
		var transient []types.BatchResultErrorEntry
		for _, f := range out.Failed {
			i, _ := strconv.Atoi(aws.ToString(f.Id))
			if f.SenderFault && i < len(chunk) {
				refused = append(refused, chunk[i])
			} else {
				transient = append(transient, f)
			}
		}
		if len(transient) > 0 {
			errs = append(errs, batchError("change visibility", transient))
		}
	}
	return refused, errors.Join(errs...)
}

// ExtendLeases sets the messages' visibility to the lease again. Those SQS
// refuses (receipt handle invalid, message not in flight) are lost.
func (s *subscriptionDriver) ExtendLeases(ctx context.Context, ms []*driver.Message) ([]*driver.Message, error) {
	return s.changeVisibility(ctx, ms, s.lease)
}

func (s *subscriptionDriver) deadQueue(ctx context.Context) (string, error) {
	s.mu.Lock()
	u := s.deadURL
	s.mu.Unlock()
	if u != "" {
		return u, nil
	}
	u, err := createFIFO(ctx, s.client, s.deadName, nil, VisibilityDefault)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	s.deadURL = u
	s.mu.Unlock()
	return u, nil
}

// DeadLetter sends m to the dead-letter queue (same group, with reason,
// attempts and time) and then deletes it from the queue.
func (s *subscriptionDriver) DeadLetter(ctx context.Context, m *driver.Message, reason string, attempts int) error {
	if s.isClosed() {
		return errClosed
	}
	dq, err := s.deadQueue(ctx)
	if err != nil {
		return err
	}
	d := m.AckID.(*delivery)
	attrs := make(map[string]types.MessageAttributeValue, len(d.attrs)+3)
	for k, v := range d.attrs {
		if k != AttrNotBefore {
			attrs[k] = v
		}
	}
	if len(reason) > maxReason {
		reason = reason[:maxReason]
		for !utf8.ValidString(reason) {
			reason = reason[:len(reason)-1]
		}
	}
	now := time.Now().UTC()
	attrs[AttrReason] = stringAttr(reason)
	attrs[AttrAttempts] = stringAttr(strconv.Itoa(attempts))
	attrs[AttrDeadAt] = stringAttr(now.Format(time.RFC3339Nano))
	if _, ok := attrs[AttrID]; !ok {
		attrs[AttrID] = stringAttr(m.ID)
	}
	group := d.group
	if group == "" {
		group = GroupID(m.Key)
	}
	if _, err := s.client.SendMessage(ctx, &sqs.SendMessageInput{
		QueueUrl: aws.String(dq), MessageBody: aws.String(d.body), MessageAttributes: attrs,
		MessageGroupId:         aws.String(group),
		MessageDeduplicationId: aws.String(dedupID(m.ID + "/dead/" + strconv.FormatInt(now.UnixNano(), 36))),
	}); err != nil {
		return fmt.Errorf("sqs: dead-letter %s: %w", m.ID, err)
	}
	if _, err := s.client.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(s.queueURL), ReceiptHandle: aws.String(d.receipt)}); err != nil {
		return fmt.Errorf("sqs: delete dead-lettered %s (it is in the dead-letter queue and may be delivered again): %w", m.ID, err)
	}
	s.book.forget(d.sqsID)
	s.settled([]*driver.Message{m})
	return nil
}

// deadMessage is a received dead letter.
type deadMessage struct {
	dl driver.DeadLetter
	rm types.Message
}

// maxDeadScan bounds how many dead letters one DeadLetters or Redrive call
// visits.
const maxDeadScan = 10_000

// walkDead visits every dead letter of the dead-letter queue once, each
// group in order, and calls take for it: a dead letter take takes out (it
// redrives and deletes it) is gone; the others are moved to the end of their
// group. It returns the dead letters it moved.
//
// Why move them: a FIFO queue hands out nothing more of a group while one
// of its messages is in flight, and one receive returns at most 10
// messages, so receiving alone cannot reach a group's later dead letters
// (a scan that kept what it received in flight listed 153 of 161). Each
// dead letter received is sent again to the end of its group, with a
// deduplication ID of this walk, and the original deleted: the group's next
// ones come, and after them the walk's own copies, in the original order.
// A group is done when its first copy comes round: that copy is held in
// flight until the walk ends, which holds the group; the walk ends when a
// receive brings nothing. Dead letters keep their attributes (reason,
// attempts, time); only their SQS message IDs change. A walk interrupted
// between a copy and the delete of its original leaves a duplicate, which
// the next walk deletes.
func (s *subscriptionDriver) walkDead(ctx context.Context, dq string, take func(dm deadMessage) (bool, error)) ([]deadMessage, error) {
	prefix := "walk-" + randomID() + "-"
	type key struct {
		id string
		at time.Time
	}
	seen := map[key]bool{}
	done := map[string]bool{} // groups whose copies came round
	var out []deadMessage
	var parked []types.Message // received from done groups, held in flight
	defer func() { s.releaseDead(dq, parked) }()
	visited, copies := 0, 0 // copies numbers the copies: a deduplication ID used twice would drop one
	for visited < maxDeadScan {
		raw, err := s.receiveRaw(ctx, dq, MaxBatchMessages, time.Second, 60*time.Second)
		if err != nil {
			return nil, err
		}
		if len(raw) == 0 {
			break // what is left is held in flight: the groups that came round
		}
		var move []types.Message
		for i, rm := range raw {
			group := rm.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]
			ours := strings.HasPrefix(rm.Attributes[string(types.MessageSystemAttributeNameMessageDeduplicationId)], prefix)
			dm := s.deadOf(rm)
			k := key{dm.dl.Message.ID, dm.dl.DeadAt}
			switch {
			case done[group] || ours:
				done[group] = true
				parked = append(parked, rm)
				continue
			case seen[k]:
				// A duplicate an interrupted walk left.
				if _, err := s.client.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(dq), ReceiptHandle: rm.ReceiptHandle}); err != nil {
					s.log.Warn("keyorder sqs: deleting a duplicate dead letter failed", "queue", dq, "id", dm.dl.Message.ID, "err", err)
				}
				continue
			}
			seen[k] = true
			visited++
			if take != nil {
				taken, err := take(dm)
				if err != nil {
					parked = append(parked, move...)
					parked = append(parked, raw[i:]...)
					return nil, err
				}
				if taken {
					continue
				}
			}
			out = append(out, dm)
			move = append(move, rm)
		}
		if len(move) > 0 {
			if err := s.moveDead(ctx, dq, move, prefix, copies); err != nil {
				return nil, err
			}
			copies += len(move)
		}
	}
	slices.SortStableFunc(out, func(a, b deadMessage) int { return a.dl.DeadAt.Compare(b.dl.DeadAt) })
	return out, nil
}

// deadOf converts a received dead letter.
func (s *subscriptionDriver) deadOf(rm types.Message) deadMessage {
	m := s.decode(&rm, false)
	dm := deadMessage{rm: rm}
	dm.dl.Message = *m
	dm.dl.Message.AckID = nil
	dm.dl.Message.Attempt = 0
	dm.dl.Reason = attrString(rm.MessageAttributes[AttrReason])
	dm.dl.Attempts, _ = strconv.Atoi(attrString(rm.MessageAttributes[AttrAttempts]))
	dm.dl.DeadAt, _ = time.Parse(time.RFC3339Nano, attrString(rm.MessageAttributes[AttrDeadAt]))
	return dm
}

// moveDead sends copies of received dead letters to the end of their groups,
// in order, with deduplication IDs prefix+n..., and deletes the originals
// whose copy was stored. What it could not move goes back (visible again).
func (s *subscriptionDriver) moveDead(ctx context.Context, dq string, rms []types.Message, prefix string, n int) error {
	entries := make([]types.SendMessageBatchRequestEntry, len(rms))
	for i, rm := range rms {
		entries[i] = types.SendMessageBatchRequestEntry{
			Id:                     aws.String(strconv.Itoa(i)),
			MessageBody:            rm.Body,
			MessageAttributes:      rm.MessageAttributes,
			MessageGroupId:         aws.String(rm.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]),
			MessageDeduplicationId: aws.String(prefix + strconv.Itoa(n+i)),
		}
	}
	out, err := s.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(dq), Entries: entries})
	if err == nil && len(out.Failed) > 0 {
		err = batchError("send", out.Failed)
	}
	if err != nil {
		// Some copies may be stored: the next walk deletes the duplicates.
		s.releaseDead(dq, rms)
		return fmt.Errorf("sqs: dead-letter walk of %s: %w", dq, err)
	}
	del := make([]types.DeleteMessageBatchRequestEntry, len(rms))
	for i, rm := range rms {
		del[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: rm.ReceiptHandle}
	}
	dout, err := s.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(dq), Entries: del})
	if err == nil && len(dout.Failed) > 0 {
		err = batchError("delete", dout.Failed)
	}
	if err != nil {
		return fmt.Errorf("sqs: dead-letter walk of %s: the moved originals stay besides their copies (the next walk deletes them): %w", dq, err)
	}
	return nil
}

// releaseDead makes received dead letters visible again, last first (see
// Release).
func (s *subscriptionDriver) releaseDead(dq string, rms []types.Message) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	for end := len(rms); end > 0; end -= MaxBatchMessages {
		chunk := rms[max(end-MaxBatchMessages, 0):end]
		entries := make([]types.ChangeMessageVisibilityBatchRequestEntry, len(chunk))
		for i := range chunk {
			entries[i] = types.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: chunk[len(chunk)-1-i].ReceiptHandle}
		}
		if _, err := s.client.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(dq), Entries: entries}); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		s.log.Warn("keyorder sqs: releasing dead letters failed; they are visible again after 60s", "queue", dq, "err", err)
		return err
	}
	return nil
}

// DeadLetters lists up to limit dead letters, oldest first. It visits every
// dead letter of the dead-letter queue (see walkDead: each is moved to the
// end of its group, in order), so a concurrent DeadLetters or Redrive call
// (in any process) may miss the ones being listed for that moment.
func (s *subscriptionDriver) DeadLetters(ctx context.Context, limit int) ([]driver.DeadLetter, error) {
	if s.isClosed() {
		return nil, errClosed
	}
	dq, err := s.deadQueue(ctx)
	if err != nil {
		return nil, err
	}
	dms, err := s.walkDead(ctx, dq, nil)
	if err != nil {
		return nil, err
	}
	if limit > 0 && len(dms) > limit {
		dms = dms[:limit]
	}
	var out []driver.DeadLetter
	for _, dm := range dms {
		out = append(out, dm.dl)
	}
	return out, nil
}

// Redrive sends the dead letters with these IDs back to the queue, each
// group's in the order they died, behind everything queued meanwhile in
// their group (with a new deduplication ID and a fresh attempt count), and
// deletes them from the dead-letter queue. It stops at the first failure.
func (s *subscriptionDriver) Redrive(ctx context.Context, ids []string) (int, error) {
	if s.isClosed() {
		return 0, errClosed
	}
	dq, err := s.deadQueue(ctx)
	if err != nil {
		return 0, err
	}
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	n := 0
	var done []string // the IDs redriven
	_, err = s.walkDead(ctx, dq, func(dm deadMessage) (bool, error) {
		if !want[dm.dl.Message.ID] {
			return false, nil
		}
		attrs := map[string]types.MessageAttributeValue{}
		for k, v := range dm.rm.MessageAttributes {
			if k != AttrReason && k != AttrAttempts && k != AttrDeadAt {
				attrs[k] = v
			}
		}
		group := dm.rm.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]
		if _, err := s.client.SendMessage(ctx, &sqs.SendMessageInput{
			QueueUrl: aws.String(s.queueURL), MessageBody: dm.rm.Body, MessageAttributes: attrs,
			MessageGroupId:         aws.String(group),
			MessageDeduplicationId: aws.String(dedupID(dm.dl.Message.ID + "/redrive/" + randomID())),
		}); err != nil {
			return false, fmt.Errorf("sqs: redrive %s: %w", dm.dl.Message.ID, err)
		}
		n++
		done = append(done, dm.dl.Message.ID)
		if _, err := s.client.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(dq), ReceiptHandle: dm.rm.ReceiptHandle}); err != nil {
			return true, fmt.Errorf("sqs: redriven %s stays in the dead-letter queue: %w", dm.dl.Message.ID, err)
		}
		return true, nil
	})
	if err != nil {
		return n, err
	}
	return n, driver.NotDeadLetters(ids, done)
}

// Capabilities describes the subscription: SQS holds groups natively, and
// under Ordered a chain whose member failed is held in process
// (HoldChains), since SQS counts every receive: a chain's later messages
// put back unrun would count as an attempt in the next process.
func (s *subscriptionDriver) Capabilities() driver.Capabilities {
	return driver.Capabilities{
		Ordering: s.ordering, NativeHold: true, HoldChains: s.ordering == policy.Ordered,
		LeaseDuration: s.lease, MaxBatch: s.maxBatch(),
	}
}

// IsRetryable reports whether err is transient.
func (s *subscriptionDriver) IsRetryable(err error) bool { return isRetryable(err) }

// ErrorCode classifies err.
func (s *subscriptionDriver) ErrorCode(err error) keyorder.ErrorCode { return errorCode(err) }

// Close marks the driver closed; unsettled messages come back when their
// visibility timeout expires. The client stays the caller's.
func (s *subscriptionDriver) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	if s.starts != nil {
		s.starts.Close()
	}
	return nil
}

// Name returns the queue's name, which is the subscription's
// (driver.Namer).
func (s *subscriptionDriver) Name() string { return queueNameOf(s.queueURL) }
