package lanes_test

import (
	"context"
	"fmt"
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
		if err := p.Submit(ctx, m.account, true, time.Time{}, m.id); err != nil {
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
