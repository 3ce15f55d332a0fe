package nats

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

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
	// AckTimeout bounds how long a batch waits for the server's
	// acknowledgements after its last message went out (a publish lost
	// in a reconnection, or a server that stops answering, is never
	// acknowledged). The batch then fails with an error matching
	// jetstream.ErrAsyncPublishTimeout that says how many of its messages
	// are unacknowledged; it is retryable, and the messages may have been
	// stored (with the message ID, a retry is deduplicated). Defaults to
	// AckTimeoutDefault.
	AckTimeout time.Duration
}

// topicDriver is the driver.Topic driver of a keyorder stream.
type topicDriver struct {
	js         jetstream.JetStream
	stream     string
	partitions int
	maxPayload int
	noMsgID    bool
	ackTimeout time.Duration
	rr         atomic.Uint64
	ownConn    *nats.Conn
	acks       *acker
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
	acks, err := newAcker(js.Conn())
	if err != nil {
		return nil, err
	}
	t := &topicDriver{js: js, stream: stream, partitions: n, maxPayload: max, ackTimeout: AckTimeoutDefault, acks: acks}
	if opts != nil {
		t.noMsgID = opts.NoMsgID
		if opts.AckTimeout > 0 {
			t.ackTimeout = opts.AckTimeout
		}
	}
	return t, nil
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

// partitionOf is the partition of key: FNV-1a (32 bits) of its bytes
// modulo partitions.
func partitionOf(key string, partitions int) int {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return int(h % uint32(partitions))
}

// appendSubject appends the subject of a message of key on partition p
// (subjectOf with keyToken's token, built in place) and reports whether
// the key itself must travel in HeaderKey.
func appendSubject(b []byte, stream string, p int, key string) ([]byte, bool) {
	b = append(b, stream...)
	b = append(b, '.')
	b = strconv.AppendInt(b, int64(p), 10)
	b = append(b, '.')
	switch {
	case key == "":
		return append(b, '_'), false
	case base64.RawURLEncoding.EncodedLen(len(key))+1 <= MaxKeyToken:
		b = append(b, 'k')
		return base64.RawURLEncoding.AppendEncode(b, []byte(key)), false
	}
	sum := sha256.Sum256([]byte(key))
	b = append(b, 'h')
	return base64.RawURLEncoding.AppendEncode(b, sum[:]), true
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

// appendMsg builds the NATS message of m, with reply subject reply (""
// for none), its subject appended to buf (which it returns, grown; a
// string of the message's subject points into it, so buf is never
// written over). A message without headers has a nil Header.
func (t *topicDriver) appendMsg(buf []byte, m *driver.Message, msgID, reply string) (*nats.Msg, []byte) {
	var p int
	if m.Key != "" {
		p = partitionOf(m.Key, t.partitions)
	} else {
		p = int(t.rr.Add(1) % uint64(t.partitions))
	}
	start := len(buf)
	buf, long := appendSubject(buf, t.stream, p, m.Key)
	subject := unsafe.String(&buf[start], len(buf)-start)
	msg := &nats.Msg{Subject: subject, Reply: reply, Data: m.Payload}
	setHeaders(msg, m, msgID, long)
	return msg, buf
}

// setHeaders sets the headers of m's NATS message msg: the Nats-Msg-Id
// msgID (none when ""), the driver's reserved headers and the
// application's, JSON-encoded. The values share one allocation; msg.Header
// stays nil when there is none.
func setHeaders(msg *nats.Msg, m *driver.Message, msgID string, long bool) {
	var vals [4]string
	var names [4]string
	n := 0
	add := func(k, v string) { names[n], vals[n] = k, v; n++ }
	if msgID != "" {
		add(nats.MsgIdHdr, msgID)
	}
	if m.ID != "" && m.ID != msgID {
		add(HeaderID, m.ID)
	}
	if long {
		add(HeaderKey, m.Key)
	}
	if !m.NotBefore.IsZero() {
		add(HeaderNotBefore, m.NotBefore.UTC().Format(time.RFC3339Nano))
	}
	var user map[string]string
	for k, v := range m.Headers {
		if !strings.HasPrefix(k, HeaderPrefix) {
			if user == nil {
				user = make(map[string]string, len(m.Headers))
			}
			user[k] = v
		}
	}
	if n == 0 && user == nil {
		return
	}
	size := n
	if user != nil {
		size++
	}
	h := make(nats.Header, size)
	all := make([]string, size)
	for i := range n {
		all[i] = vals[i]
		h[names[i]] = all[i : i+1 : i+1]
	}
	if user != nil {
		b, _ := json.Marshal(user)
		all[n] = string(b)
		h[HeaderHeaders] = all[n : n+1 : n+1]
	}
	msg.Header = h
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
	for _, m := range ms {
		if err := checkHeaders(m.Headers); err != nil {
			return err
		}
	}
	if len(ms) == 0 {
		return nil
	}
	nc := t.js.Conn()
	id, b, reply := t.acks.start(len(ms))
	// One buffer holds the batch's subjects and reply subjects (the
	// client copies them into its write buffer; nothing keeps them after
	// SendBatch returns but the *nats.Msg values, which are dropped).
	buf := make([]byte, 0, len(ms)*(len(t.stream)+len(reply)+40))
	for i, m := range ms {
		msgID := m.ID
		if t.noMsgID {
			msgID = ""
		}
		if cap(buf)-len(buf) < len(t.stream)+len(reply)+MaxKeyToken+16 {
			buf = make([]byte, 0, max(4096, (len(ms)-i)*(len(t.stream)+len(reply)+40)))
		}
		rs := len(buf)
		buf = append(buf, reply...)
		buf = strconv.AppendInt(buf, int64(i), 10)
		r := unsafe.String(&buf[rs], len(buf)-rs)
		var msg *nats.Msg
		msg, buf = t.appendMsg(buf, m, msgID, r)
		var err error
		if msg.Header == nil {
			err = nc.PublishRequest(msg.Subject, r, msg.Data)
		} else {
			err = nc.PublishMsg(msg)
		}
		if err != nil {
			t.acks.forget(id)
			return fmt.Errorf("nats: publish to %s (message %d of %d): %w", t.stream, i+1, len(ms), err)
		}
	}
	timer := time.NewTimer(t.ackTimeout)
	defer timer.Stop()
	select {
	case <-b.done:
	case <-ctx.Done():
		t.acks.forget(id)
		return ctx.Err()
	case <-timer.C:
		t.acks.forget(id)
		return fmt.Errorf("nats: publish to %s: %d of %d messages unacknowledged after %v: %w",
			t.stream, t.acks.left(b), len(ms), t.ackTimeout, jetstream.ErrAsyncPublishTimeout)
	}
	if b.err != nil {
		return fmt.Errorf("nats: publish to %s (message %d of %d): %w", t.stream, b.errAt+1, len(ms), b.err)
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
	case <-t.acks.drained():
	case <-time.After(30 * time.Second):
	}
	_ = t.acks.sub.Unsubscribe()
	if t.ownConn != nil {
		t.ownConn.Close()
	}
	return nil
}
