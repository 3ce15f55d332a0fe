package pulsar

import (
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"
)

// TestProducerPendingWindow: the producer's queue of messages awaiting
// receipts defaults to MaxPendingMessagesDefault, not the client's 1,000,
// which let a key's batch into the producer about one message at a time
// when many keys publish at once (issue 21: one request per message at
// 1,000 keys); a template's own value is kept.
func TestProducerPendingWindow(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts *TopicOptions
		want int
	}{
		{"nil options", nil, MaxPendingMessagesDefault},
		{"no template", &TopicOptions{BatchingMaxPublishDelay: 10}, MaxPendingMessagesDefault},
		{"template without it", &TopicOptions{ProducerOptions: &pulsar.ProducerOptions{BatcherBuilderType: pulsar.KeyBasedBatchBuilder}}, MaxPendingMessagesDefault},
		{"template with it", &TopicOptions{ProducerOptions: &pulsar.ProducerOptions{BatcherBuilderType: pulsar.KeyBasedBatchBuilder, MaxPendingMessages: 500}}, 500},
		{"batching disabled", &TopicOptions{DisableBatching: true}, MaxPendingMessagesDefault},
	} {
		po, err := tc.opts.producerOptions("t")
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if po.MaxPendingMessages != tc.want {
			t.Errorf("%s: MaxPendingMessages %d, want %d", tc.name, po.MaxPendingMessages, tc.want)
		}
	}
}
