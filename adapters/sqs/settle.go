package sqs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

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
