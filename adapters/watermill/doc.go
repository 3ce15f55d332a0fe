// Package watermill mounts keyorder in a Watermill
// (github.com/ThreeDotsLabs/watermill) application.
//
// Many teams already run a Watermill router with its handlers and
// middleware. This package lets them keep all of it and get keyorder's
// per-key guarantee, two ways:
//
//   - Publisher and Subscriber implement message.Publisher and
//     message.Subscriber over any keyorder backend (memory, PostgreSQL,
//     Pub/Sub, SQS FIFO, Pulsar, Kafka, NATS), chosen by a URL template. The router gets
//     messages of different keys concurrently, and a key's next message only
//     after the current one is acknowledged; a Nack under Ordered holds only
//     its key (retried in place with backoff, dead-lettered after
//     MaxAttempts), not the whole consumer group.
//   - Middleware is a message.HandlerMiddleware that gives a router fed by
//     ANY Watermill subscriber (gochannel, googlecloud, sql, kafka, ...)
//     per-key mutual exclusion in arrival order and, under Ordered, retries
//     a failed message in place before anything behind it in its key.
//
// Watermill is imported only by this package, so keyorder users who do not
// run Watermill do not link it.
//
// docs/watermill.md in the repository
// (https://github.com/keyorder/keyorder/blob/main/docs/watermill.md) shows
// both mounts with a router, how to stack Middleware with Watermill's
// Retry, Recoverer and PoisonQueue, and which of Watermill's universal
// tests each backend passes.
//
// # URLs
//
// A URL template is a keyorder URL in which {topic} stands for the
// Watermill topic and, in a subscriber's template, {group} for the consumer
// group (which names the keyorder subscription). Publisher and subscriber
// take templates of their own, because backends reject subscription
// parameters on a topic URL. For example:
//
//	publisher                   subscriber
//	mem://{topic}               mem://{topic}?subscription={topic}.{group}&ordering=ordered
//	postgres://h/db?topic={topic}   postgres://h/db?topic={topic}&subscription={group}
//	pubsub://project/{topic}    pubsub://project/{topic}?subscription={topic}-{group}
//	sqs://{topic}.fifo?endpoint=…   sqs://{topic}.fifo?endpoint=…  (no consumer groups)
//
// The template is checked when the Publisher or Subscriber is built: it must
// contain {topic}, no other placeholder (a publisher's no {group}), and its
// scheme must be registered (import the adapter for side effects); the
// error matches keyorder.ErrBadURL or keyorder.ErrUnknownScheme. The values
// are escaped with url.PathEscape before they are substituted. Memory and
// Pub/Sub subscription names are global to the broker or project, so their
// templates put the topic in the subscription name.
//
// # Ordering
//
// The key of a published message is resolved, first that is set wins, from
// the partition-key metadata, then KeyConfig.KeyFunc, then KeyConfig.Key
// (fixed where the publisher is mounted): the same order as publish, where
// the per-message key comes before the mount site's fixed key. Under
// policy.Reject (the default) a message that has no key fails Publish with
// keyorder.ErrMissingKey and nothing of the call is sent. KeyDecorator puts
// the same resolution in front of any Watermill publisher.
//
// A delivered message carries its key in the partition-key metadata and the
// keyorder message ID as its Watermill UUID (the Publisher sends the
// Watermill UUID as the keyorder ID, so a UUID survives the round trip).
//
// # Delivery semantics
//
// Ack acknowledges; Nack is a failed attempt: it is retried with the
// subscription's backoff and dead-lettered after subscribe.Config.Retry
// MaxAttempts, as a handler error is in package subscribe. The message's
// context ends when it is acked or nacked, or when the subscriber closes.
// Messages handed to the router and not settled when the subscriber closes
// go back to the broker without counting an attempt, after waiting up to
// SubscriberConfig.CloseTimeout for the router to settle them.
package watermill
