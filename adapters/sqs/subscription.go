package sqs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

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
