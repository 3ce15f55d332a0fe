package lanes

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/policy"
)

// TestSubmitAllKeepsEachKeysOrder: SubmitAll queues a batch spread over
// every lane as Submits in turn would: each key's items run in order, one
// at a time, keyless items run, an item due later waits for its time (and
// under Ordered holds its key), and one already due runs at once.
func TestSubmitAllKeepsEachKeysOrder(t *testing.T) {
	for _, a := range []Assignment{ByKey, Shared} {
		for _, o := range []policy.Ordering{policy.Exclusive, policy.Ordered} {
			t.Run(a.String()+"/"+o.String(), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					start := time.Now()
					var mu sync.Mutex
					running := map[string]int{}
					seen := map[string][]int{}
					at := map[int]time.Duration{}
					p := mustNew(t, &Config{Workers: 4, Assign: a, Ordering: o, Capacity: 300},
						func(ctx context.Context, key string, keyed bool, v int) Result {
							mu.Lock()
							running[key]++
							if keyed && running[key] > 1 {
								t.Errorf("key %s: %d in flight", key, running[key])
							}
							seen[key] = append(seen[key], v)
							at[v] = time.Since(start)
							mu.Unlock()
							time.Sleep(time.Millisecond)
							mu.Lock()
							running[key]--
							mu.Unlock()
							return Done()
						})
					var its []Item
					var vs []int
					for i := range 600 {
						it := Item{Key: fmt.Sprint("key", i%20), Keyed: i%20 != 0}
						switch i {
						case 1:
							it.NotBefore = start.Add(time.Hour) // due later: key1 waits (Ordered)
						case 2:
							it.NotBefore = start.Add(-time.Hour) // due already
						}
						its, vs = append(its, it), append(vs, i)
					}
					n, err := p.SubmitAll(context.Background(), its[:300], vs[:300])
					if n != 300 || err != nil {
						t.Fatalf("SubmitAll = %d, %v; want 300, nil", n, err)
					}
					n, err = p.SubmitAll(context.Background(), its[300:], vs[300:])
					if n != 300 || err != nil {
						t.Fatalf("second SubmitAll = %d, %v; want 300, nil", n, err)
					}
					time.Sleep(2 * time.Hour)
					mu.Lock()
					defer mu.Unlock()
					for k := 1; k < 20; k++ {
						key := fmt.Sprint("key", k)
						got := seen[key]
						if len(got) != 30 {
							t.Fatalf("key %s ran %d items, want 30", key, len(got))
						}
						if k == 1 && o == policy.Exclusive {
							// Its not-yet-due head lets the rest go first.
							got = append(got[len(got)-1:], got[:len(got)-1]...)
						}
						if !slices.IsSorted(got) {
							t.Errorf("key %s ran %v, want in order", key, got)
						}
					}
					if len(seen[""]) != 30 {
						t.Errorf("%d keyless items ran, want 30", len(seen[""]))
					}
					if at[1] < time.Hour {
						t.Errorf("item due in an hour ran after %v", at[1])
					}
					if o == policy.Ordered && at[21] < time.Hour {
						t.Errorf("key1's second item ran after %v, before its held head", at[21])
					}
					if at[2] >= time.Hour {
						t.Errorf("item due already waited %v", at[2])
					}
					closePool(t, p)
				})
			})
		}
	}
}

// TestSubmitAllFallsBackToSubmit: when a lane has no room for its share,
// SubmitAll queues item by item as Submit does, blocking on the full lane;
// if ctx ends meanwhile it reports the prefix it queued. On a closing pool
// it queues nothing and returns ErrClosed.
func TestSubmitAllFallsBackToSubmit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		p := mustNew(t, &Config{Workers: 1, Capacity: 2},
			func(ctx context.Context, key string, keyed bool, v int) Result {
				<-gate
				return Done()
			})
		k := Item{Key: "k", Keyed: true}
		its, vs := []Item{k, k, k, k}, []int{0, 1, 2, 3}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		// 0 runs (blocked), 1 and 2 wait: the lane is full, 3 blocks.
		n, err := p.SubmitAll(ctx, its, vs)
		if n != 3 || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("SubmitAll on a lane with room for 3 = %d, %v; want 3, DeadlineExceeded", n, err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			if n, err := p.SubmitAll(context.Background(), its[:2], vs[:2]); n != 2 || err != nil {
				t.Errorf("blocked SubmitAll = %d, %v; want 2, nil", n, err)
			}
		}()
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("SubmitAll on a full lane returned, want it blocked")
		default:
		}
		close(gate)
		<-done
		closePool(t, p)
		if n, err := p.SubmitAll(context.Background(), its, vs); n != 0 || !errors.Is(err, keyorder.ErrClosed) {
			t.Errorf("SubmitAll after Close = %d, %v; want 0, ErrClosed", n, err)
		}
	})
}

// TestSubmitAllLengthMismatchPanics: its and vs must match.
func TestSubmitAllLengthMismatchPanics(t *testing.T) {
	p := mustNew(t, nil, func(ctx context.Context, key string, keyed bool, v int) Result { return Done() })
	defer closePool(t, p)
	defer func() {
		if recover() == nil {
			t.Error("SubmitAll with 2 items and 1 value did not panic")
		}
	}()
	p.SubmitAll(context.Background(), []Item{{}, {}}, []int{1})
}
