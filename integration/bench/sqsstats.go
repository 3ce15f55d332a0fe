package main

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
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
	// inflight: receipt handle → group of the messages received and not
	// yet deleted (or released) on the queue cur; groups: group → such
	// messages. The group is the key index the payload starts with (both
	// the raw client and keyorder send the payload base64-encoded).
	inflight map[string]uint32
	groups   map[uint32]int
	cur      string
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
	// For ReceiveMessage: groups and messages in flight when the call
	// was made (summed), and calls slower than 100 ms.
	inGroups, inMsgs, slow int
}

func newSQSStats(next aws.HTTPClient) *sqsStats {
	return &sqsStats{next: next, q: map[string]map[string]*sqsAPIStats{}, inflight: map[string]uint32{}, groups: map[uint32]int{}}
}

// sqsRequest is the part of a JSON-protocol request body the stats read.
type sqsRequest struct {
	QueueURL            string `json:"QueueUrl"`
	MaxNumberOfMessages int
	WaitTimeSeconds     int
	Entries             []struct {
		VisibilityTimeout *int
		ReceiptHandle     string
	}
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
	s.mu.Lock()
	inGroups, inMsgs := len(s.groups), len(s.inflight)
	s.mu.Unlock()
	start := time.Now()
	resp, err := s.next.Do(req)
	if err != nil || target == "" {
		return resp, err
	}
	items := len(in.Entries)
	var got []struct{ ReceiptHandle, Body string }
	if target == "ReceiveMessage" {
		raw, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(raw))
		if rerr == nil {
			var out struct {
				Messages []struct{ ReceiptHandle, Body string }
			}
			_ = json.Unmarshal(raw, &out)
			items = len(out.Messages)
			got = out.Messages
		}
	}
	rtt := time.Since(start)
	q := in.QueueURL[strings.LastIndex(in.QueueURL, "/")+1:]
	s.mu.Lock()
	defer s.mu.Unlock()
	if q != s.cur {
		// A new queue: what the last one left in flight (the final
		// receives of a consume, never deleted) is no longer counted.
		s.cur = q
		clear(s.inflight)
		clear(s.groups)
	}
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
	if target == "ReceiveMessage" {
		a.inGroups += inGroups
		a.inMsgs += inMsgs
		if rtt > 100*time.Millisecond {
			a.slow++
		}
		for _, m := range got {
			p, _ := base64.StdEncoding.DecodeString(m.Body)
			if len(p) >= 4 {
				g := binary.BigEndian.Uint32(p)
				s.inflight[m.ReceiptHandle] = g
				s.groups[g]++
			}
		}
	}
	if target == "DeleteMessageBatch" || target == "ChangeMessageVisibilityBatch" {
		for _, e := range in.Entries {
			if g, ok := s.inflight[e.ReceiptHandle]; ok && (target == "DeleteMessageBatch" || (e.VisibilityTimeout != nil && *e.VisibilityTimeout == 0)) {
				delete(s.inflight, e.ReceiptHandle)
				if s.groups[g]--; s.groups[g] <= 0 {
					delete(s.groups, g)
				}
			}
		}
	}
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
			fmt.Fprintf(&b, ", asked %.2f/call, %d with wait, %d over 100 ms, in flight at call %.1f msgs %.1f groups", float64(a.asked)/float64(a.calls), a.waited, a.slow, float64(a.inMsgs)/float64(a.calls), float64(a.inGroups)/float64(a.calls))
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
