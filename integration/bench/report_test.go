package main

import (
	"strings"
	"testing"
	"time"
)

// TestRatiosDivideByRefName: a row with refName divides by the row of
// that name on the same key count, the others by the reference.
func TestRatiosDivideByRefName(t *testing.T) {
	r := &report{backend: &backend{title: "T"}, o: options{n: 10, size: 1}, started: time.Now(), results: []result{
		{system: "raw", ref: true, keys: 5, publish: 100, consume: 100, e2e: 100},
		{system: "raw + id", keys: 5, publish: 50, consume: 100, e2e: 100},
		{system: "ko", refName: "raw + id", keys: 5, publish: 45, consume: 80, e2e: 50},
		{system: "ko off", refName: "raw", keys: 5, publish: 90, consume: 80, e2e: 50},
		{system: "raw", ref: true, keys: 7, publish: 200, consume: 200, e2e: 200},
		{system: "ko", refName: "raw + id", keys: 7, publish: 45, consume: 80, e2e: 50},
	}}
	md := r.markdown()
	for _, want := range []string{
		"| 5 | raw + id | 50 | 100 | 100 | 0.50× | 1.00× | 1.00× |",
		"| 5 | ko | 45 | 80 | 50 | 0.90× | 0.80× | 0.50× |",
		"| 5 | ko off | 90 | 80 | 50 | 0.90× | 0.80× | 0.50× |",
		"| 7 | ko | 45 | 80 | 50 | – | – | – |", // no "raw + id" row at 7 keys
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}
