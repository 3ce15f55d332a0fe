package policy

import (
	"testing"
	"time"
)

func TestParseOrdering(t *testing.T) {
	for _, o := range []Ordering{Parallel, Exclusive, Ordered} {
		got, err := ParseOrdering(o.String())
		if err != nil || got != o {
			t.Fatalf("ParseOrdering(%q) = %v, %v", o.String(), got, err)
		}
	}
	if _, err := ParseOrdering("fifo"); err == nil {
		t.Fatal("ParseOrdering(fifo) accepted")
	}
}

func TestMissingKeyResolve(t *testing.T) {
	cases := []struct {
		m    MissingKey
		o    Ordering
		want MissingKey
	}{
		{MissingKeyDefault, Ordered, Reject},
		{MissingKeyDefault, Exclusive, Reject},
		{MissingKeyDefault, Parallel, Unordered},
		{Unordered, Ordered, Unordered},
		{Reject, Parallel, Reject},
	}
	for _, c := range cases {
		if got := c.m.Resolve(c.o); got != c.want {
			t.Errorf("%v.Resolve(%v) = %v, want %v", c.m, c.o, got, c.want)
		}
	}
	if _, err := ParseMissingKey("drop"); err == nil {
		t.Fatal("ParseMissingKey(drop) accepted")
	}
}

func TestBackoff(t *testing.T) {
	r := Retry{MinBackoff: time.Second, MaxBackoff: 10 * time.Second, NoJitter: true}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	for i, w := range want {
		if got := r.Backoff(i + 1); got != w {
			t.Errorf("Backoff(%d) = %v, want %v", i+1, got, w)
		}
	}
	j := Retry{MinBackoff: time.Second}
	for i := 0; i < 100; i++ {
		if d := j.Backoff(1); d < 800*time.Millisecond || d > 1200*time.Millisecond {
			t.Fatalf("jittered Backoff(1) = %v, outside ±20%%", d)
		}
	}
}

func TestRetryValidate(t *testing.T) {
	if err := (Retry{MaxAttempts: -1}).Validate(); err == nil {
		t.Fatal("negative MaxAttempts accepted")
	}
	if err := (Retry{MinBackoff: time.Minute, MaxBackoff: time.Second}).Validate(); err == nil {
		t.Fatal("MinBackoff > MaxBackoff accepted")
	}
	if err := (Retry{}).WithDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestValid(t *testing.T) {
	for _, o := range []Ordering{Parallel, Exclusive, Ordered} {
		if !o.Valid() {
			t.Errorf("%v not valid", o)
		}
	}
	for _, o := range []Ordering{-1, Parallel + 1, 99} {
		if o.Valid() {
			t.Errorf("%v valid", o)
		}
	}
	for _, m := range []MissingKey{MissingKeyDefault, Reject, Unordered} {
		if !m.Valid() {
			t.Errorf("%v not valid", m)
		}
	}
	for _, m := range []MissingKey{-1, Unordered + 1, 99} {
		if m.Valid() {
			t.Errorf("%v valid", m)
		}
	}
}
