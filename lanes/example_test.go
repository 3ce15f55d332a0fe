package lanes_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/keyorder/keyorder/lanes"
	"github.com/keyorder/keyorder/policy"
)

// A ledger applies adjustments per account. Under Ordered a failed
// adjustment holds its account until it is retried; other accounts go on.
func Example() {
	failed := false
	done := make(chan struct{})
	p, err := lanes.New(&lanes.Config{Workers: 1, Ordering: policy.Ordered},
		func(ctx context.Context, account string, keyed bool, id int) lanes.Result {
			if id == 101 && !failed {
				failed = true
				fmt.Println(account, id, "fails: retry in 10ms")
				return lanes.RetryAt(time.Now().Add(10 * time.Millisecond))
			}
			fmt.Println(account, id, "applied")
			if id == 102 {
				close(done)
			}
			return lanes.Done()
		})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for _, m := range []struct {
		account string
		id      int
	}{{"acct-42", 101}, {"acct-42", 102}, {"acct-7", 201}} {
		if err := p.Submit(ctx, lanes.Item{Key: m.account, Keyed: true}, m.id); err != nil {
			panic(err)
		}
	}
	<-done
	leftover, err := p.Close(ctx)
	fmt.Println("leftover:", leftover, err)
	// Output:
	// acct-42 101 fails: retry in 10ms
	// acct-7 201 applied
	// acct-42 101 applied
	// acct-42 102 applied
	// leftover: [] <nil>
}

// Shared puts every item on one lane served by several workers: any free
// worker takes the oldest deliverable item. Under Ordered a key still has at
// most one item in flight and keeps its submission order, whichever workers
// run it; keyless items belong to no group and run whenever a worker is free.
func Example_shared() {
	var (
		mu          sync.Mutex // workers run concurrently
		byKey       = map[string][]int{}
		inFlight    = map[string]int{}
		maxInFlight int
		keyless     int
		wg          sync.WaitGroup
	)
	p, err := lanes.New(&lanes.Config{Workers: 4, Assign: lanes.Shared, Ordering: policy.Ordered},
		func(ctx context.Context, key string, keyed bool, n int) lanes.Result {
			defer wg.Done()
			mu.Lock()
			if !keyed {
				keyless++
				mu.Unlock()
				return lanes.Done()
			}
			inFlight[key]++
			maxInFlight = max(maxInFlight, inFlight[key])
			byKey[key] = append(byKey[key], n)
			mu.Unlock()

			time.Sleep(time.Millisecond) // the work

			mu.Lock()
			inFlight[key]--
			mu.Unlock()
			return lanes.Done()
		})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for n := range 12 {
		key, keyed := []string{"acct-42", "acct-7", ""}[n%3], n%3 != 2
		wg.Add(1)
		if err := p.Submit(ctx, lanes.Item{Key: key, Keyed: keyed}, n); err != nil {
			panic(err)
		}
	}
	wg.Wait()
	if _, err := p.Close(ctx); err != nil {
		panic(err)
	}
	fmt.Println("acct-42:", byKey["acct-42"])
	fmt.Println("acct-7:", byKey["acct-7"])
	fmt.Println("keyless:", keyless, "most in flight per key:", maxInFlight)
	// Output:
	// acct-42: [0 3 6 9]
	// acct-7: [1 4 7 10]
	// keyless: 4 most in flight per key: 1
}
