package sqs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/keyorder/keyorder/driver"
)

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
