package subscribe

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// attemptCtx must behave like context.WithCancel whenever it is first
// looked at: before or after the attempt ends, or its parent's end.
func TestAttemptCtxLikeWithCancel(t *testing.T) {
	type key struct{}
	dl := time.Now().Add(time.Hour)
	for _, tc := range []struct {
		name                    string
		cancelFirst, parentDead bool
	}{
		{"live", false, false},
		{"ended before use", true, false},
		{"parent ended before use", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent, stopParent := context.WithDeadline(context.WithValue(context.Background(), key{}, "v"), dl)
			defer stopParent()
			c := &attemptCtx{parent: parent}
			if tc.cancelFirst {
				c.cancel()
			}
			if tc.parentDead {
				stopParent()
			}
			if d, ok := c.Deadline(); !ok || !d.Equal(dl) {
				t.Fatalf("Deadline = %v, %v", d, ok)
			}
			if got := c.Value(key{}); got != "v" {
				t.Fatalf("Value = %v", got)
			}
			dead := tc.cancelFirst || tc.parentDead
			if got := c.Err() != nil; got != dead {
				t.Fatalf("Err = %v before any cancel", c.Err())
			}
			child, stopChild := context.WithCancel(c)
			defer stopChild()
			c.cancel()
			for _, ctx := range []context.Context{c, child} {
				select {
				case <-ctx.Done():
				case <-time.After(5 * time.Second):
					t.Fatal("not done after cancel")
				}
				if !errors.Is(ctx.Err(), context.Canceled) {
					t.Fatalf("Err = %v", ctx.Err())
				}
				if !errors.Is(context.Cause(ctx), context.Canceled) {
					t.Fatalf("Cause = %v", context.Cause(ctx))
				}
			}
			if s := fmt.Sprint(c); s == "" {
				t.Fatal("empty String")
			}
		})
	}
}

// A handler may read ctx while its lease keeper cancels it.
func TestAttemptCtxConcurrent(t *testing.T) {
	for range 100 {
		c := &attemptCtx{parent: context.Background()}
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); <-c.Done() }()
		go func() { defer wg.Done(); c.cancel() }()
		wg.Wait()
		if c.Err() == nil {
			t.Fatal("not cancelled")
		}
	}
}
