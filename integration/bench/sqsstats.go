package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
)

// sqsStats counts the SQS calls passing through a client, per queue and
// API (the X-Amz-Target header of the JSON protocol): calls, the messages
// or entries each carried, and their round-trip times. The -rpcs flag
// prints a queue's consume-side calls after each backlog consume.
type sqsStats struct {
	next aws.HTTPClient
	mu   sync.Mutex
	q    map[string]map[string]*sqsAPIStats // queue name → API → stats
}

type sqsAPIStats struct {
	calls int
	items int           // messages received, or entries of a batch call
	hist  map[int]int   // items per call → calls
	rtt   time.Duration // summed
	// For ChangeMessageVisibilityBatch: entries setting visibility 0
	// (releases) and more than 0 (extensions).
	release, extend int
	// For ReceiveMessage: messages asked for, and calls with a wait.
	asked, waited int
}

func newSQSStats(next aws.HTTPClient) *sqsStats {
	return &sqsStats{next: next, q: map[string]map[string]*sqsAPIStats{}}
}

// sqsRequest is the part of a JSON-protocol request body the stats read.
type sqsRequest struct {
	QueueURL            string `json:"QueueUrl"`
	MaxNumberOfMessages int
	WaitTimeSeconds     int
	Entries             []struct{ VisibilityTimeout *int }
}

// Do sends req, counting it.
func (s *sqsStats) Do(req *http.Request) (*http.Response, error) {
	target := strings.TrimPrefix(req.Header.Get("X-Amz-Target"), "AmazonSQS.")
	var in sqsRequest
	if req.Body != nil {
		raw, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(raw))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil }
		_ = json.Unmarshal(raw, &in)
	}
	start := time.Now()
	resp, err := s.next.Do(req)
	if err != nil || target == "" {
		return resp, err
	}
	items := len(in.Entries)
	if target == "ReceiveMessage" {
		raw, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(raw))
		if rerr == nil {
			var out struct{ Messages []json.RawMessage }
			_ = json.Unmarshal(raw, &out)
			items = len(out.Messages)
		}
	}
	rtt := time.Since(start)
	q := in.QueueURL[strings.LastIndex(in.QueueURL, "/")+1:]
	s.mu.Lock()
	defer s.mu.Unlock()
	byAPI := s.q[q]
	if byAPI == nil {
		byAPI = map[string]*sqsAPIStats{}
		s.q[q] = byAPI
	}
	a := byAPI[target]
	if a == nil {
		a = &sqsAPIStats{hist: map[int]int{}}
		byAPI[target] = a
	}
	a.calls++
	a.items += items
	a.hist[items]++
	a.rtt += rtt
	a.asked += in.MaxNumberOfMessages
	if in.WaitTimeSeconds > 0 {
		a.waited++
	}
	for _, e := range in.Entries {
		if e.VisibilityTimeout != nil && *e.VisibilityTimeout == 0 {
			a.release++
		} else if e.VisibilityTimeout != nil {
			a.extend++
		}
	}
	return resp, err
}

// consumeLine describes the consume-side calls on the queue named id+".fifo",
// per message consumed (n).
func (s *sqsStats) consumeLine(id string, n int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	byAPI := s.q[id+".fifo"]
	var b strings.Builder
	for _, api := range []string{"ReceiveMessage", "DeleteMessageBatch", "ChangeMessageVisibilityBatch", "ChangeMessageVisibility", "DeleteMessage"} {
		a := byAPI[api]
		if a == nil {
			continue
		}
		fmt.Fprintf(&b, "\n      %-28s %6d calls (%.3f/msg), %.2f items/call, rtt %.1f ms", api, a.calls, float64(a.calls)/float64(n), float64(a.items)/float64(a.calls), float64(a.rtt.Microseconds())/1000/float64(a.calls))
		if api == "ReceiveMessage" {
			fmt.Fprintf(&b, ", asked %.2f/call, %d with wait", float64(a.asked)/float64(a.calls), a.waited)
		}
		if a.release+a.extend > 0 {
			fmt.Fprintf(&b, ", %d released, %d extended", a.release, a.extend)
		}
		var ks []int
		for k := range a.hist {
			ks = append(ks, k)
		}
		slices.Sort(ks)
		b.WriteString("\n        items/call:")
		for _, k := range ks {
			fmt.Fprintf(&b, " %d:%d", k, a.hist[k])
		}
	}
	return b.String()
}
