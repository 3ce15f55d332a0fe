package sqs

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/driverkit"
	"github.com/keyorder/keyorder/policy"
)

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
		d.mark = &driverkit.StartMark{ID: d.sqsID, Msg: m.ID, Earlier: s.receives(rm, m) - 1}
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
