package keyorder

import (
	"time"

	"github.com/google/uuid"
)

// HeaderPartitionKey is the header that carries a message's ordering key.
// On publish it is the second source of the key (after Message.Key). A
// Delivery carries its key in Message.Key only: its Headers are the
// message's own (nil when it has none), so a message without headers is
// delivered without allocating a map. (The Watermill mount still sets the
// key in this metadata entry.)
const HeaderPartitionKey = "partition-key"

// Message is what an application publishes.
type Message struct {
	// ID identifies the message. When it is empty, the publisher assigns a
	// UUID (version 7) to the copy it sends and returns it (Publish,
	// Result.Get); the caller's Message is never modified. Choose IDs up
	// front with NewID to know them before publishing. Subscribers use the
	// ID to suppress redeliveries of a message this process already
	// acknowledged.
	ID string
	// Key is the ordering key. Empty means "resolve it": the partition-key
	// header, then the publisher's fixed key; see publish.Config.
	Key string
	// Payload is the message body. Publishing does not retain it: the
	// publisher sends a copy, taken before Publish, PublishAsync or
	// PublishBatch returns, so the caller may reuse the buffer at once
	// (Headers likewise). In a Delivery it is that delivery's own copy:
	// the handler may modify it (or keep it), and the change reaches
	// neither another subscription's delivery nor a later attempt of the
	// message, whether the broker redelivers it or the subscriber retries
	// it in process.
	Payload []byte
	// Headers are string attributes carried with the message.
	Headers map[string]string
	// NotBefore delays delivery: the message is not handled before this time,
	// and under Ordered its group is held until then. Zero means no delay.
	NotBefore time.Time
}

// Delivery is one delivery of a message to a handler: one attempt. It is
// the handler's to keep, and so are its Payload and Headers: each attempt
// gets its own, so what a handler writes into them reaches no other
// delivery, of this subscription (a retry) or of another.
type Delivery struct {
	// Message is the delivered message. Message.Key is the ordering key
	// ("" for a keyless message); Headers are the headers it was
	// published with (nil when none), without HeaderPartitionKey.
	Message
	// Attempt is 1 on the first delivery and grows with each retry or lost
	// lease. Where retries run in process (Pub/Sub), a process that dies
	// takes its count with it: the broker's redelivery counts only
	// deliveries, so across a crash a message can run more than MaxAttempts
	// times in total.
	Attempt int
	// PublishTime is when the broker accepted the message, when known.
	PublishTime time.Time
	// Subscription is the name of the subscription the message was
	// delivered on, as the application gave it (the subscription ID, the
	// SQS queue name, ...): never a URL, so no secret of a URL reaches a
	// handler or its logs. It is empty when the driver does not know it
	// (a driver without driver.Namer).
	Subscription string
}

// NewID returns a new message ID: a UUID (version 7, time-ordered), the
// kind publishers assign to a message whose ID is empty. Set Message.ID to
// it to know a message's ID before publishing it.
func NewID() string {
	// NewV7 fails only when crypto/rand does, which since Go 1.24 crashes
	// the program instead of returning an error.
	return uuid.Must(uuid.NewV7()).String()
}
