package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"sync"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
)

// rpcs, when set, prints after each measured backlog publish how many
// publish requests reached the broker and how many messages they carried
// (on backends that count them: pubsub, pulsar).
var rpcs = flag.Bool("rpcs", false, "print publish requests per run (pubsub, pulsar) and consume-side calls (sqs)")

// publishOnly skips the consume and end-to-end phases (consume and
// end-to-end figures read 0).
var publishOnly = flag.Bool("publish-only", false, "measure publishing only (no consume, no end-to-end)")

// pubStats counts publish requests and their messages per topic.
type pubStats struct {
	mu    sync.Mutex
	reqs  map[string]int // topic → requests
	msgs  map[string]int // topic → messages
	bytes map[string]int // topic → request bytes (payloads and keys)
}

func newPubStats() *pubStats {
	return &pubStats{reqs: map[string]int{}, msgs: map[string]int{}, bytes: map[string]int{}}
}

func (s *pubStats) add(topic string, msgs, bytes int) {
	s.mu.Lock()
	s.reqs[topic]++
	s.msgs[topic] += msgs
	s.bytes[topic] += bytes
	s.mu.Unlock()
}

// line describes the requests of the topic whose name ends with id.
func (s *pubStats) line(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for t, n := range s.reqs {
		if !strings.HasSuffix(t, "/"+id) && t != id {
			continue
		}
		m := s.msgs[t]
		return fmt.Sprintf("%d requests, %d messages: %.1f requests per 1,000 messages, %.1f messages and %.0f B per request",
			n, m, 1000*float64(n)/float64(max(m, 1)), float64(m)/float64(n), float64(s.bytes[t])/float64(n))
	}
	return "no requests counted"
}

// unary counts the Pub/Sub Publish RPCs passing through a client connection.
func (s *pubStats) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if r, ok := req.(*pubsubpb.PublishRequest); ok {
		b := 0
		for _, m := range r.Messages {
			b += len(m.Data) + len(m.OrderingKey)
		}
		s.add(r.Topic, len(r.Messages), b)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// pulsarStats reads the Pulsar client's metrics (registered in reg, by
// topic) and describes the send requests of the topic named id: the
// client observes one RPC latency per request (a batch of one key under
// key-based batching).
func pulsarStats(reg *prometheus.Registry) func(id string) string {
	return func(id string) string {
		mfs, err := reg.Gather()
		if err != nil {
			return err.Error()
		}
		var reqs, msgs float64
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				ours := false
				for _, l := range m.GetLabel() {
					if l.GetName() == "topic" && strings.HasSuffix(l.GetValue(), "/"+id) {
						ours = true
					}
				}
				if !ours {
					continue
				}
				switch mf.GetName() {
				case "pulsar_client_producer_rpc_latency_seconds":
					reqs += float64(m.GetHistogram().GetSampleCount())
				case "pulsar_client_messages_published":
					msgs += m.GetCounter().GetValue()
				}
			}
		}
		if reqs == 0 {
			return "no requests counted"
		}
		return fmt.Sprintf("%.0f requests, %.0f messages: %.1f requests per 1,000 messages, %.1f messages per request",
			reqs, msgs, 1000*reqs/max(msgs, 1), msgs/reqs)
	}
}
