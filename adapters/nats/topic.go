package nats

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
)

// TopicOptions configure a Topic driver. A nil *TopicOptions means
// defaults.
type TopicOptions struct {
	// MaxPayloadBytes overrides the payload limit; defaults to the
	// stream's max_msg_size (or the server's max_payload when the stream
	// sets none) less HeaderRoom.
	MaxPayloadBytes int
	// NoMsgID publishes without the Nats-Msg-Id header (URL: msg_id=off).
	// By default every message carries its ID as Nats-Msg-Id, so a batch
	// sent again after a lost acknowledgement is dropped by the stream's
	// duplicate window: a retried publish lands once. The server checks
	// and records every ID in that window, which costs publish throughput
	// (see docs/nats.md); without the header the ID travels in HeaderID,
	// the subscriber sees the same ID, and a retried publish can land
	// twice (at-least-once publishing).
	NoMsgID bool
}

// topicDriver is the driver.Topic driver of a keyorder stream.
type topicDriver struct {
	js         jetstream.JetStream
	stream     string
	partitions int
	maxPayload int
	noMsgID    bool
	rr         atomic.Uint64
	ownConn    *nats.Conn
}

var (
	_ driver.Topic          = (*topicDriver)(nil)
	_ driver.MixedKeySender = (*topicDriver)(nil)
)

var validName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,200}$`)

// streamPartitions reads the partition count of a keyorder stream.
func streamPartitions(info *jetstream.StreamInfo) (int, error) {
	n, err := strconv.Atoi(info.Config.Metadata[MetadataPartitions])
	if err != nil || n <= 0 || n > 4096 {
		return 0, fmt.Errorf("%w: %s has no valid %s metadata (create it with EnsureStream or a URL with create=true)",
			errBadStream, info.Config.Name, MetadataPartitions)
	}
	return n, nil
}

// EnsureStream creates the keyorder stream name with partitions partitions
// (PartitionsDefault when <= 0) if it does not exist, and returns its
// partition count (an existing stream keeps its own).
func EnsureStream(ctx context.Context, js jetstream.JetStream, name string, partitions int) (int, error) {
	if !validName.MatchString(name) {
		return 0, fmt.Errorf("%w: nats: stream name %q: want letters, digits, '_' or '-'", keyorder.ErrInvalidConfig, name)
	}
	if partitions <= 0 {
		partitions = PartitionsDefault
	}
	st, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		st, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name:       name,
			Subjects:   []string{name + ".>"},
			Storage:    jetstream.FileStorage,
			Duplicates: 2 * time.Minute,
			Metadata:   map[string]string{MetadataPartitions: strconv.Itoa(partitions)},
		})
	}
	if err != nil {
		return 0, fmt.Errorf("nats: stream %s: %w", name, err)
	}
	return streamPartitions(st.CachedInfo())
}

// openTopic opens the publishing driver of stream over js; the stream must
// exist.
func openTopic(ctx context.Context, js jetstream.JetStream, stream string, opts *TopicOptions) (*topicDriver, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: nats.OpenTopic: nil JetStream", keyorder.ErrInvalidConfig)
	}
	if !validName.MatchString(stream) {
		return nil, fmt.Errorf("%w: nats.OpenTopic: stream name %q: want letters, digits, '_' or '-'", keyorder.ErrInvalidConfig, stream)
	}
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("nats: stream %s: %w", stream, err)
	}
	info := st.CachedInfo()
	n, err := streamPartitions(info)
	if err != nil {
		return nil, err
	}
	max := int(info.Config.MaxMsgSize)
	if srv := int(js.Conn().MaxPayload()); max <= 0 || max > srv {
		max = srv
	}
	max -= HeaderRoom
	if opts != nil && opts.MaxPayloadBytes > 0 && opts.MaxPayloadBytes < max {
		max = opts.MaxPayloadBytes
	}
	if max <= 0 {
		return nil, fmt.Errorf("%w: nats: stream %s allows messages of %d bytes, less than the driver's header room %d",
			keyorder.ErrInvalidConfig, stream, info.Config.MaxMsgSize, HeaderRoom)
	}
	return &topicDriver{js: js, stream: stream, partitions: n, maxPayload: max, noMsgID: opts != nil && opts.NoMsgID}, nil
}

// keyToken returns the subject token of key and whether the key itself
// must travel in HeaderKey.
func keyToken(key string) (string, bool) {
	if key == "" {
		return "_", false
	}
	if base64.RawURLEncoding.EncodedLen(len(key))+1 <= MaxKeyToken {
		return "k" + base64.RawURLEncoding.EncodeToString([]byte(key)), false
	}
	sum := sha256.Sum256([]byte(key))
	return "h" + base64.RawURLEncoding.EncodeToString(sum[:]), true
}

// keyFromToken decodes a subject token; long keys come from the header.
func keyFromToken(tok string, h nats.Header) string {
	switch {
	case strings.HasPrefix(tok, "k"):
		if b, err := base64.RawURLEncoding.DecodeString(tok[1:]); err == nil {
			return string(b)
		}
	case strings.HasPrefix(tok, "h"):
		return h.Get(HeaderKey)
	}
	return ""
}

// partitionOf is the partition of key.
func partitionOf(key string, partitions int) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % uint32(partitions))
}

// subjectOf is the subject of a message of key on partition p.
func subjectOf(stream string, p int, tok string) string {
	return stream + "." + strconv.Itoa(p) + "." + tok
}

// checkHeaders rejects reserved or oversized headers.
func checkHeaders(h map[string]string) error {
	size := 0
	for k, v := range h {
		if len(k) >= len(HeaderPrefix) && strings.EqualFold(k[:len(HeaderPrefix)], HeaderPrefix) || strings.HasPrefix(strings.ToLower(k), "nats-") {
			return fmt.Errorf("%w %q: the %s and Nats- prefixes are reserved: %w", errBadHeader, k, HeaderPrefix,
				&keyorder.LimitError{Limit: "header name", Backend: "nats"})
		}
		size += len(k) + len(v)
	}
	if size > MaxHeaderBytes/2 {
		return fmt.Errorf("%w: %w", errBadHeader, &keyorder.LimitError{Limit: "header size", Max: MaxHeaderBytes / 2, Got: size, Backend: "nats"})
	}
	return nil
}

// toMsg builds the NATS message of m; msgID is its Nats-Msg-Id ("" for
// none).
func (t *topicDriver) toMsg(m *driver.Message, msgID string) *nats.Msg {
	tok, long := keyToken(m.Key)
	var p int
	if m.Key != "" {
		p = partitionOf(m.Key, t.partitions)
	} else {
		p = int(t.rr.Add(1) % uint64(t.partitions))
	}
	return buildMsg(subjectOf(t.stream, p, tok), m, msgID, long)
}

func buildMsg(subject string, m *driver.Message, msgID string, long bool) *nats.Msg {
	msg := nats.NewMsg(subject)
	msg.Data = m.Payload
	if msgID != "" {
		msg.Header.Set(nats.MsgIdHdr, msgID)
	}
	if m.ID != "" && m.ID != msgID {
		msg.Header.Set(HeaderID, m.ID)
	}
	if long {
		msg.Header.Set(HeaderKey, m.Key)
	}
	if !m.NotBefore.IsZero() {
		msg.Header.Set(HeaderNotBefore, m.NotBefore.UTC().Format(time.RFC3339Nano))
	}
	if len(m.Headers) > 0 {
		user := make(map[string]string, len(m.Headers))
		for k, v := range m.Headers {
			if !strings.HasPrefix(k, HeaderPrefix) {
				user[k] = v
			}
		}
		if len(user) > 0 {
			b, _ := json.Marshal(user)
			msg.Header.Set(HeaderHeaders, string(b))
		}
	}
	return msg
}

// SendsMixedKeys: SendBatch publishes each key's messages in slice order.
func (t *topicDriver) SendsMixedKeys() bool { return true }

// SendBatch publishes ms asynchronously, in order (one connection keeps
// the order of its publishes), and waits for every acknowledgement. Each
// carries its ID as Nats-Msg-Id (unless TopicOptions.NoMsgID), so a batch
// the portable layer sends again after a lost acknowledgement is
// deduplicated by the stream's duplicate window. A failure of any message
// fails the batch.
func (t *topicDriver) SendBatch(ctx context.Context, ms []*driver.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	futs := make([]jetstream.PubAckFuture, 0, len(ms))
	for _, m := range ms {
		if err := checkHeaders(m.Headers); err != nil {
			return err
		}
	}
	for i, m := range ms {
		msgID := m.ID
		if t.noMsgID {
			msgID = ""
		}
		f, err := t.js.PublishMsgAsync(t.toMsg(m, msgID))
		if err != nil {
			return fmt.Errorf("nats: publish to %s (message %d of %d): %w", t.stream, i+1, len(ms), err)
		}
		futs = append(futs, f)
	}
	for i, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("nats: publish to %s (message %d of %d): %w", t.stream, i+1, len(ms), err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Limits: keys of at most MaxKeyBytes, payloads of the stream's message
// size less HeaderRoom, headers whose names and values total at most half
// of MaxHeaderBytes (their JSON escapes may double them).
func (t *topicDriver) Limits() driver.Limits {
	return driver.Limits{
		Backend:          "nats",
		MaxKeyBytes:      MaxKeyBytes,
		KeyUTF8:          true,
		MaxPayloadBytes:  t.maxPayload,
		MaxHeaderBytes:   MaxHeaderBytes / 2,
		MaxBatchMessages: MaxBatchMessages,
		Check:            func(m *keyorder.Message) error { return checkHeaders(m.Headers) },
	}
}

// IsRetryable reports whether err is transient.
func (t *topicDriver) IsRetryable(err error) bool { return isRetryable(err) }

// ErrorCode classifies err.
func (t *topicDriver) ErrorCode(err error) keyorder.ErrorCode { return errorCode(err) }

// Close waits for outstanding publishes and closes the connection when
// the driver opened it (URL opener).
func (t *topicDriver) Close() error {
	select {
	case <-t.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
	}
	if t.ownConn != nil {
		t.ownConn.Close()
	}
	return nil
}
