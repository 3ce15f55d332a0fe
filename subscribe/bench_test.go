package subscribe_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// BenchmarkConsume measures the portable consume layer alone: Receive →
// pump → lanes → handler → acknowledgement, over a driver that hands out
// messages built before the timer starts and whose Ack only counts, so
// that publishing and a broker's own work are out of the picture. b.N
// messages over 1,000 keys, a no-op handler, Ordered. hold=native is the
// shape of PostgreSQL (the broker holds keys, acknowledgements are final:
// driver.FinalAcker); hold=inprocess that of Kafka (the subscriber holds
// keys and remembers acknowledged IDs, the driver records starts). An op
// is one message acknowledged.
func BenchmarkConsume(b *testing.B) {
	for _, native := range []bool{true, false} {
		for _, workers := range []int{8, 64} {
			hold := "native"
			if !native {
				hold = "inprocess"
			}
			b.Run(fmt.Sprintf("hold=%s/workers=%d", hold, workers), func(b *testing.B) {
				benchConsume(b, native, workers)
			})
		}
	}
}

func benchConsume(b *testing.B, native bool, workers int) {
	ms := make([]*driver.Message, b.N)
	for i := range ms {
		ms[i] = &driver.Message{ID: fmt.Sprint(i), Key: fmt.Sprint("key-", i%1000), Payload: []byte("x"), Attempt: 1}
	}
	drv := &benchDriver{ms: ms, native: native, done: make(chan struct{})}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sub, err := subscribe.New(drv, &subscribe.Config{Workers: workers, MaxOutstanding: 2000, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu := time.Now(), processCPU()
	go sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error { return nil })
	<-drv.done
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	if end := processCPU(); cpu >= 0 && end >= 0 {
		b.ReportMetric(float64(end-cpu)/float64(b.N), "cpu-ns/msg")
	}
	b.StopTimer()
	sub.Close(ctx)
}

// processCPU returns the CPU time this process has used (user and
// system), read from /proc/self/stat in clock ticks of 10 ms; -1 where
// there is no /proc. On a shared machine msgs/s swings with the load, the
// CPU per message much less.
func processCPU() time.Duration {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return -1
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return -1
	}
	var t time.Duration
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return -1
		}
		t += time.Duration(n) * 10 * time.Millisecond
	}
	return t
}

// benchDriver hands out ms in order, at most a receive batch at a time,
// and counts acknowledgements; done is closed when all are acknowledged.
type benchDriver struct {
	native bool
	mu     sync.Mutex
	ms     []*driver.Message
	next   int
	acked  atomic.Int64
	done   chan struct{}
}

func (d *benchDriver) Receive(ctx context.Context, n int) ([]*driver.Message, error) {
	d.mu.Lock()
	out := d.ms[d.next:min(d.next+n, len(d.ms))]
	d.next += len(out)
	d.mu.Unlock()
	if len(out) == 0 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return out, nil
}

func (d *benchDriver) Ack(ctx context.Context, ms []*driver.Message) error {
	if d.acked.Add(int64(len(ms))) == int64(len(d.ms)) {
		close(d.done)
	}
	return nil
}

func (d *benchDriver) Nack(ctx context.Context, m *driver.Message, delay time.Duration) error {
	return nil
}
func (d *benchDriver) Release(ctx context.Context, ms []*driver.Message) error { return nil }
func (d *benchDriver) ExtendLeases(ctx context.Context, ms []*driver.Message) ([]*driver.Message, error) {
	return nil, nil
}
func (d *benchDriver) DeadLetter(ctx context.Context, m *driver.Message, reason string, attempts int) error {
	return nil
}
func (d *benchDriver) Capabilities() driver.Capabilities {
	return driver.Capabilities{Ordering: policy.Ordered, NativeHold: d.native, LeaseDuration: 30 * time.Second, MaxBatch: 500}
}
func (d *benchDriver) AcksFinal() bool                                         { return d.native }
func (d *benchDriver) IsRetryable(err error) bool                              { return false }
func (d *benchDriver) ErrorCode(err error) keyorder.ErrorCode                  { return keyorder.CodeUnknown }
func (d *benchDriver) Close() error                                            { return nil }
func (d *benchDriver) Started(ctx context.Context, ms []*driver.Message) error { return nil }
