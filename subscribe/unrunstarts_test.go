package subscribe_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/keyordertest/model"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// With a driver that records handler starts (driver.StartRecorder), a
// RunBatch batch is recorded with all its members, but a handler failing
// at index i did not handle those after it (keyorder.FailedAt). Their
// recorded starts must not spend their attempts: m2, behind m0 and m1,
// each failing twice before it succeeds, was handed in four batches it
// never ran in and dead-lettered unrun at attempt 5 (issue 28 item 9; seed
// 2363 of the model property test with KEYORDER_MODEL_CLASSES=unrunDead:
// three batches behind a poison message). Native hold, so the members
// behind the failed one go back to the broker each time (with a Returner:
// returned with their attempts; without: released, their unrun starts
// remembered).
func TestUnhandledBatchMembersKeepTheirAttempts(t *testing.T) {
	for _, returner := range []bool{false, true} {
		name := "release"
		if returner {
			name = "returner"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, err := model.New(&model.Config{
					Ordering: policy.Ordered, NativeHold: true,
					StartRecorder: true, Returner: returner, LeaseDuration: 10 * time.Second, MaxBatch: 3,
				})
				if err != nil {
					t.Fatal(err)
				}
				if err := b.Topic().SendBatch(context.Background(), []*driver.Message{
					{ID: "m0", Key: "k", Payload: []byte("0")}, {ID: "m1", Key: "k", Payload: []byte("1")}, {ID: "m2", Key: "k", Payload: []byte("2")},
				}); err != nil {
					t.Fatal(err)
				}
				s, err := subscribe.New(b.NewInstance().Driver(), &subscribe.Config{
					Logger: quiet, Batch: &subscribe.BatchConfig{MaxSize: 3, MaxWait: time.Millisecond},
					Retry: policy.Retry{MaxAttempts: 3, MinBackoff: time.Second, MaxBackoff: time.Second},
				})
				if err != nil {
					t.Fatal(err)
				}
				var mu sync.Mutex
				var ran []string
				fails := map[string]int{"m0": 2, "m1": 2}
				done := make(chan error, 1)
				go func() {
					done <- s.RunBatch(context.Background(), func(ctx context.Context, ds []*keyorder.Delivery) error {
						for i, d := range ds {
							mu.Lock()
							ran = append(ran, fmt.Sprintf("%s@%d", d.ID, d.Attempt))
							if fails[d.ID] > 0 {
								fails[d.ID]--
								mu.Unlock()
								return keyorder.FailedAt(i, errors.New("not yet"))
							}
							mu.Unlock()
						}
						return nil
					})
				}()
				for range 60 {
					if len(b.Unsettled()) == 0 {
						break
					}
					time.Sleep(time.Second)
					synctest.Wait()
				}
				if err := s.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				var dead []string
				for _, dl := range b.DeadLetters() {
					dead = append(dead, dl.Message.ID)
				}
				mu.Lock()
				defer mu.Unlock()
				if len(dead) != 0 || !b.Acked("m0") || !b.Acked("m1") || !b.Acked("m2") {
					t.Fatalf("dead letters %v, unsettled %v (runs %v); want all three run and acknowledged", dead, b.Unsettled(), ran)
				}
			})
		})
	}
}
