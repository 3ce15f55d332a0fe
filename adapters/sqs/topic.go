package sqs

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// topicDriver is the driver.Topic driver of one FIFO queue.
type topicDriver struct {
	client   *sqs.Client
	queueURL string
	ordering policy.Ordering
}

var _ driver.Topic = (*topicDriver)(nil)

// openTopic returns a publishing driver for the FIFO queue at queueURL. The
// queue's ordering is read from its keyorder-ordering tag (Ordered when it
// has none); opts is accepted for symmetry and may be nil. The client stays
// the caller's.
func openTopic(ctx context.Context, client *sqs.Client, queueURL string, opts *Options) (*topicDriver, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: sqs.OpenTopic: nil client", keyorder.ErrInvalidConfig)
	}
	ord, err := queueOrdering(ctx, client, queueURL, nil)
	if err != nil {
		return nil, err
	}
	return &topicDriver{client: client, queueURL: queueURL, ordering: ord}, nil
}

// dedupID maps an ID onto SQS's deduplication-id alphabet like GroupID.
func dedupID(id string) string { return GroupID(id) }

func randomID() string {
	var b [16]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// emptyValue is how an empty header value travels: SQS refuses empty
// attribute values, and a single NUL byte is no value the portable rule
// lets a header have.
var emptyValue = []byte{0}

// stringAttr returns s as a String attribute, or as a Binary one when it is
// not SQS text (or empty: emptyValue).
func stringAttr(s string) types.MessageAttributeValue {
	if s == "" {
		return types.MessageAttributeValue{DataType: aws.String("Binary"), BinaryValue: emptyValue}
	}
	if sqsText(s) {
		return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(s)}
	}
	return types.MessageAttributeValue{DataType: aws.String("Binary"), BinaryValue: []byte(s)}
}

func attrString(v types.MessageAttributeValue) string {
	if v.StringValue != nil {
		return *v.StringValue
	}
	if bytes.Equal(v.BinaryValue, emptyValue) {
		return ""
	}
	return string(v.BinaryValue)
}

// encoded is a message ready for SQS.
type encoded struct {
	body  string
	attrs map[string]types.MessageAttributeValue
	group string
	dedup string
}

// encode converts a driver message, checking what SQS would refuse.
func encode(m *driver.Message, ordering policy.Ordering) (*encoded, error) {
	if len(m.ID) > MaxIDBytes {
		return nil, fmt.Errorf("%w: ID longer than %d bytes", errBadMessage, MaxIDBytes)
	}
	if len(m.Headers) > MaxHeaders {
		return nil, fmt.Errorf("%w: %d headers, SQS allows at most %d besides the driver's attributes", errBadMessage, len(m.Headers), MaxHeaders)
	}
	e := &encoded{attrs: make(map[string]types.MessageAttributeValue, len(m.Headers)+4)}
	for k, v := range m.Headers {
		if strings.HasPrefix(strings.ToLower(k), AttrPrefix) {
			return nil, fmt.Errorf("%w: header %q: the %s prefix is reserved for the driver", errBadMessage, k, AttrPrefix)
		}
		if k == "" || len(k) > 256 || strings.HasPrefix(strings.ToLower(k), "aws.") || strings.HasPrefix(strings.ToLower(k), "amazon.") || strings.HasPrefix(k, ".") || strings.HasSuffix(k, ".") || strings.Contains(k, "..") {
			return nil, fmt.Errorf("%w: header name %q is not a valid SQS attribute name", errBadMessage, k)
		}
		for i := 0; i < len(k); i++ {
			c := k[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
				return nil, fmt.Errorf("%w: header name %q: SQS attribute names allow A-Z a-z 0-9 - _ . only", errBadMessage, k)
			}
		}
		if !utf8.ValidString(v) {
			return nil, fmt.Errorf("%w: header %q: value is not valid UTF-8", errBadMessage, k)
		}
		e.attrs[k] = stringAttr(v)
	}
	id := m.ID
	if id == "" {
		id = randomID()
	}
	e.attrs[AttrID] = stringAttr(id)
	e.dedup = dedupID(id)
	switch {
	case m.Key == "" || ordering == policy.Parallel:
		e.group = "m-" + e.dedup
		if len(e.group) > 128 {
			e.group = GroupID("m-" + id)
		}
	default:
		e.group = GroupID(m.Key)
	}
	if m.Key != "" {
		e.attrs[AttrKey] = stringAttr(m.Key)
	}
	if !m.NotBefore.IsZero() {
		e.attrs[AttrNotBefore] = stringAttr(m.NotBefore.UTC().Format(time.RFC3339Nano))
	}
	if len(m.Payload) == 0 {
		return nil, fmt.Errorf("%w: SQS message bodies cannot be empty", errBadMessage)
	}
	if s := string(m.Payload); sqsText(s) {
		e.body = s
	} else {
		e.body = base64.StdEncoding.EncodeToString(m.Payload)
		e.attrs[AttrEncoding] = stringAttr("base64")
	}
	if n := e.size(); n > MaxMessageBytes {
		return nil, fmt.Errorf("%w: %w", errBadMessage, &keyorder.LimitError{
			Limit: "encoded size (body as sent, base64 for a binary payload, plus attributes)", Max: MaxMessageBytes, Got: n, Backend: "sqs"})
	}
	return e, nil
}

// size is the message size as SQS counts it: body plus attribute names,
// types and values.
func (e *encoded) size() int {
	n := len(e.body)
	for k, v := range e.attrs {
		n += len(k) + len(aws.ToString(v.DataType)) + len(aws.ToString(v.StringValue)) + len(v.BinaryValue)
	}
	return n
}

// SendBatch sends ms with SendMessageBatch, 10 per call, in order, stopping
// at the first failing call. Every message is checked before anything is
// sent. When SQS fails part of a call the whole SendBatch fails, although
// the call's other messages (and earlier calls') were stored: at least once.
func (t *topicDriver) SendBatch(ctx context.Context, ms []*driver.Message) error {
	es := make([]*encoded, len(ms))
	for i, m := range ms {
		e, err := encode(m, t.ordering)
		if err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
		es[i] = e
	}
	for start := 0; start < len(es); start += MaxBatchMessages {
		chunk := es[start:min(start+MaxBatchMessages, len(es))]
		entries := make([]types.SendMessageBatchRequestEntry, len(chunk))
		for i, e := range chunk {
			entries[i] = types.SendMessageBatchRequestEntry{
				Id:                     aws.String(strconv.Itoa(i)),
				MessageBody:            aws.String(e.body),
				MessageAttributes:      e.attrs,
				MessageGroupId:         aws.String(e.group),
				MessageDeduplicationId: aws.String(e.dedup),
			}
		}
		out, err := t.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(t.queueURL), Entries: entries})
		if err != nil {
			return fmt.Errorf("sqs: send to %s: %w", t.queueURL, err)
		}
		if len(out.Failed) > 0 {
			return batchError("send", out.Failed)
		}
	}
	return nil
}

// BatchEntryError reports the failed entries of an SQS batch call; its
// ErrorCode is the first failed entry's code, as for SQS API errors.
type BatchEntryError struct {
	// Op names the call ("send", "delete", "change visibility").
	Op string
	// Code and Message are the first failed entry's.
	Code    string
	Message string
	// SenderFault is the first failed entry's: false means SQS's fault
	// (transient).
	SenderFault bool
	// Failed counts the entries of the call that failed.
	Failed int
}

// Error implements error.
func (e *BatchEntryError) Error() string {
	return fmt.Sprintf("sqs: %s: %d entries failed, first: %s: %s (sender fault %v)", e.Op, e.Failed, e.Code, e.Message, e.SenderFault)
}

// ErrorCode returns the first failed entry's error code.
func (e *BatchEntryError) ErrorCode() string { return e.Code }

// ErrorMessage returns the first failed entry's message.
func (e *BatchEntryError) ErrorMessage() string { return e.Message }

func batchError(op string, failed []types.BatchResultErrorEntry) error {
	f := failed[0]
	return &BatchEntryError{Op: op, Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault, Failed: len(failed)}
}

// Limits returns SQS's limits as the driver applies them.
func (t *topicDriver) Limits() driver.Limits {
	return driver.Limits{
		Backend:            "sqs",
		MaxKeyBytes:        MaxKeyBytes,
		KeyUTF8:            true,
		MaxPayloadBytes:    MaxPayloadBytes,
		PayloadRequired:    true,
		MaxBatchMessages:   MaxBatchMessages,
		MaxHeaders:         MaxHeaders,
		MaxHeaderNameBytes: 256,
		Check:              checkEncode,
	}
}

// checkEncode is encode's verdict on m, for driver.Validate: the same
// checks SendBatch applies, run before anything is sent.
func checkEncode(m *keyorder.Message) error {
	am := &driver.Message{ID: m.ID, Key: m.Key, Payload: m.Payload, Headers: m.Headers, NotBefore: m.NotBefore}
	_, err := encode(am, policy.Ordered)
	if err == nil {
		return nil
	}
	var le *keyorder.LimitError
	if errors.As(err, &le) {
		return le
	}
	return errors.New(strings.TrimPrefix(err.Error(), errBadMessage.Error()+": "))
}

// IsRetryable reports whether err is transient (throttling, 5xx, network).
func (t *topicDriver) IsRetryable(err error) bool { return isRetryable(err) }

// ErrorCode classifies err.
func (t *topicDriver) ErrorCode(err error) keyorder.ErrorCode { return errorCode(err) }

// Close does nothing: the client is the caller's (or the URL opener's,
// which needs no closing).
func (t *topicDriver) Close() error { return nil }
