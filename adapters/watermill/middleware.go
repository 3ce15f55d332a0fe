package watermill

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/lanes"
	"github.com/keyorder/keyorder/policy"
)

// MiddlewareWorkersDefault is the default MiddlewareConfig.Workers.
const MiddlewareWorkersDefault = 64

// MiddlewareConfig configures a Middleware. A nil *MiddlewareConfig means
// defaults.
type MiddlewareConfig struct {
	// KeyFunc derives the key of a message that has no partition-key
	// metadata. Messages left without a key belong to no group and run
	// whenever a worker is free.
	KeyFunc func(*message.Message) string
	// Workers bounds the handlers running at once (all keys together).
	// Defaults to MiddlewareWorkersDefault.
	Workers int
	// Retry is the in-place retry budget and backoff under Ordered and
	// Exclusive: a failed message is retried up to MaxAttempts attempts
	// (policy.MaxAttemptsDefault by default) before its error goes back to
	// the router. Under Ordered the key's later messages wait meanwhile.
	Retry policy.Retry
}

// Middleware gives a Watermill router fed by ANY subscriber per-key mutual
// exclusion in arrival order, on keyorder's lanes. Add it to the router (or
// a handler) with AddMiddleware(m.Middleware); docs/watermill.md in the
// repository shows how to stack it with Watermill's Retry, Recoverer and
// PoisonQueue.
//
// Arrival order is the order in which the router's handler goroutines enter
// the middleware. A router hands each message to its own goroutine, so two
// messages that a subscriber emits back to back, concurrently, enter in the
// order the scheduler runs them. Messages of a key that a subscriber emits
// in publish order, each only after the previous one is acked (Kafka
// partitions, keyorder's Subscriber), keep their order exactly. gochannel
// does not keep a key's order: it emits one message at a time, but hands
// each published message to a goroutine of its own, so back-to-back
// publishes reach the router in the order those goroutines run, unless its
// Config.BlockPublishUntilSubscriberAck is set.
//
// A message whose key is free, while fewer than Workers handlers run, runs
// in the router's own handler goroutine (lanes.Pool.SubmitOrRun); one that
// waits behind its key, or for a worker, and every in-place retry, runs on
// one of the middleware's workers while the router's goroutine waits.
type Middleware struct {
	cfg      MiddlewareConfig
	ordering policy.Ordering
	pool     *lanes.Pool[*job]
	// jobs recycles jobs and their channels, so the middleware does not
	// allocate them per message. (Per Middleware, not global: a channel
	// must not cross testing/synctest bubbles.)
	jobs sync.Pool
}

// job is one message waiting in a lane, and its result.
type job struct {
	h       message.HandlerFunc
	msg     *message.Message
	attempt int
	out     []*message.Message
	err     error
	// state tells the caller and the goroutine that finishes the job
	// which of them comes first (jobPending, jobFinished, jobWaited), so
	// that a job finished before its caller waits (run in the caller's
	// goroutine, mostly) costs no channel operation.
	state atomic.Int32
	done  chan struct{} // buffered (1): signalled once per waited use, reused
}

const (
	jobPending  = iota // neither finished nor waited for
	jobFinished        // finished before the caller waited: no signal
	jobWaited          // the caller waits on done
)

// finish hands the job's result to its caller.
func (j *job) finish() {
	if !j.state.CompareAndSwap(jobPending, jobFinished) {
		j.done <- struct{}{}
	}
}

// wait waits until the job is finished.
func (j *job) wait() {
	if j.state.CompareAndSwap(jobPending, jobWaited) {
		<-j.done
	}
}

// NewMiddleware returns a Middleware with the per-key policy ordering:
// Ordered (a failed message is retried in place and holds its key), or
// Exclusive (one message of a key at a time; a failed one retried in place
// lets the key's later messages run first); Parallel only bounds the
// handlers running at once. Close it when the router has stopped.
func NewMiddleware(ordering policy.Ordering, cfg *MiddlewareConfig) (*Middleware, error) {
	c := MiddlewareConfig{}
	if cfg != nil {
		c = *cfg
	}
	if c.Workers < 0 {
		return nil, fmt.Errorf("%w: MiddlewareConfig.Workers must not be negative", keyorder.ErrInvalidConfig)
	}
	if c.Workers == 0 {
		c.Workers = MiddlewareWorkersDefault
	}
	if err := c.Retry.Validate(); err != nil {
		return nil, fmt.Errorf("%w: MiddlewareConfig.Retry: %v", keyorder.ErrInvalidConfig, err)
	}
	c.Retry = c.Retry.WithDefaults()
	m := &Middleware{cfg: c, ordering: ordering}
	m.jobs.New = func() any { return &job{done: make(chan struct{}, 1)} }
	pool, err := lanes.New(&lanes.Config{Workers: c.Workers, Assign: lanes.Shared, Ordering: ordering}, m.run)
	if err != nil {
		return nil, err
	}
	m.pool = pool
	return m, nil
}

// Middleware is the message.HandlerMiddleware.
func (m *Middleware) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		key := msg.Metadata.Get(keyorder.HeaderPartitionKey)
		if key == "" && m.cfg.KeyFunc != nil {
			key = m.cfg.KeyFunc(msg)
		}
		j := m.jobs.Get().(*job)
		j.h, j.msg, j.attempt = h, msg, 1
		// The handler runs in this goroutine when the key is free and a
		// worker's place is, without the hand-off to a lane worker and
		// back; otherwise a worker runs it in the key's turn. Either way
		// run signals done.
		if _, err := m.pool.SubmitOrRun(msg.Context(), lanes.Item{Key: key, Keyed: key != ""}, j); err != nil {
			return nil, m.refused(j, err)
		}
		j.wait()
		out, err := j.out, j.err
		j.h, j.msg, j.out, j.err, j.attempt = nil, nil, nil, nil, 0
		j.state.Store(jobPending)
		m.jobs.Put(j)
		return out, err
	}
}

// refused puts back a job the lanes did not take, and returns the error.
func (m *Middleware) refused(j *job, err error) error {
	j.h, j.msg = nil, nil
	m.jobs.Put(j)
	return fmt.Errorf("keyorder middleware: %w", err)
}

// run is the lanes handler: it runs the wrapped handler, retries a failure
// in place while the budget lasts, and otherwise finishes the job.
func (m *Middleware) run(ctx context.Context, key string, keyed bool, j *job) lanes.Result {
	j.out, j.err = call(j.h, j.msg)
	if j.err != nil && keyed && m.ordering.Keyed() && j.attempt < m.cfg.Retry.MaxAttempts &&
		ctx.Err() == nil && j.msg.Context().Err() == nil && !isPermanent(j.err) {
		delay := m.cfg.Retry.Backoff(j.attempt)
		var re *keyorder.RetryError
		if errors.As(j.err, &re) {
			delay = re.After
		}
		j.attempt++
		return lanes.RetryAt(time.Now().Add(delay))
	}
	j.finish()
	return lanes.Done()
}

func isPermanent(err error) bool {
	var pe *keyorder.PermanentError
	return errors.As(err, &pe)
}

// call runs h, turning a panic into an error (a lane worker must not panic).
// recover is called only when h did not return: on the router's goroutine
// (see Middleware) the call alone would grow a fresh goroutine's stack.
func call(h message.HandlerFunc, msg *message.Message) (out []*message.Message, err error) {
	returned := false
	defer func() {
		if returned {
			return
		}
		if r := recover(); r != nil {
			out, err = nil, &keyorder.PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	out, err = h(msg)
	returned = true
	return out, err
}

// Close stops the middleware's lanes: handlers running finish (until ctx
// ends), and messages still waiting fail with keyorder.ErrClosed, so the
// router nacks them.
func (m *Middleware) Close(ctx context.Context) error {
	left, err := m.pool.Close(ctx)
	for _, j := range left {
		j.err = fmt.Errorf("keyorder middleware: %w", keyorder.ErrClosed)
		j.finish()
	}
	return err
}
