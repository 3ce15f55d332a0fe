package driver

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/keyorder/keyorder"
)

// The portable rule for keys and headers, the same on every backend (see
// keyorder's package documentation):
//
//   - an ordering key and a message ID are valid UTF-8 without NUL (U+0000);
//   - a header name is non-empty valid UTF-8 without NUL and does not start
//     with "keyorder-", which drivers reserve for their own attributes;
//   - a header value is valid UTF-8 without NUL (it may be empty).
//
// Backends narrow it through Limits (lengths, counts, SQS's attribute-name
// alphabet), never widen it, so what one backend accepts the others accept
// too unless a stated limit says otherwise; and what a backend accepts
// arrives byte for byte.

// ReservedHeaderPrefix starts the header names drivers reserve for their
// own attributes.
const ReservedHeaderPrefix = "keyorder-"

// Validate checks a driver message against the portable key and header rule
// and lim, and returns a *keyorder.LimitError (matching
// keyorder.ErrInvalidMessage) naming the first limit m breaks. An empty ID
// is checked as a 36-byte UUID, the ID Prepare gives it.
func Validate(lim Limits, m *Message) error {
	b := lim.Backend
	if lim.MaxKeyBytes > 0 && len(m.Key) > lim.MaxKeyBytes {
		return &keyorder.LimitError{Limit: "key length", Max: lim.MaxKeyBytes, Got: len(m.Key), Backend: b}
	}
	if !utf8.ValidString(m.Key) {
		return &keyorder.LimitError{Limit: "key is not valid UTF-8", Backend: b}
	}
	if strings.IndexByte(m.Key, 0) >= 0 {
		return &keyorder.LimitError{Limit: "key contains NUL", Backend: b}
	}
	if !utf8.ValidString(m.ID) {
		return &keyorder.LimitError{Limit: "ID is not valid UTF-8", Backend: b}
	}
	if strings.IndexByte(m.ID, 0) >= 0 {
		return &keyorder.LimitError{Limit: "ID contains NUL", Backend: b}
	}
	if lim.PayloadRequired && len(m.Payload) == 0 {
		return &keyorder.LimitError{Limit: "empty payload", Backend: b}
	}
	if lim.MaxPayloadBytes > 0 && len(m.Payload) > lim.MaxPayloadBytes {
		return &keyorder.LimitError{Limit: "payload size", Max: lim.MaxPayloadBytes, Got: len(m.Payload), Backend: b}
	}
	if lim.MaxHeaders > 0 && len(m.Headers) > lim.MaxHeaders {
		return &keyorder.LimitError{Limit: "header count", Max: lim.MaxHeaders, Got: len(m.Headers), Backend: b}
	}
	total := 0
	for k, v := range m.Headers {
		switch {
		case k == "":
			return &keyorder.LimitError{Limit: "header name is empty", Backend: b}
		case !utf8.ValidString(k):
			return &keyorder.LimitError{Limit: "header name is not valid UTF-8", Backend: b}
		case strings.IndexByte(k, 0) >= 0:
			return &keyorder.LimitError{Limit: fmt.Sprintf("header name %q contains NUL", k), Backend: b}
		case strings.HasPrefix(strings.ToLower(k), ReservedHeaderPrefix):
			return &keyorder.LimitError{Limit: fmt.Sprintf("header name %q: the %s prefix is reserved for drivers", k, ReservedHeaderPrefix), Backend: b}
		case !utf8.ValidString(v):
			return &keyorder.LimitError{Limit: fmt.Sprintf("header %q value is not valid UTF-8", k), Backend: b}
		case strings.IndexByte(v, 0) >= 0:
			return &keyorder.LimitError{Limit: fmt.Sprintf("header %q value contains NUL", k), Backend: b}
		case lim.MaxHeaderNameBytes > 0 && len(k) > lim.MaxHeaderNameBytes:
			return &keyorder.LimitError{Limit: "header name length", Max: lim.MaxHeaderNameBytes, Got: len(k), Backend: b}
		case lim.MaxHeaderValueBytes > 0 && len(v) > lim.MaxHeaderValueBytes:
			return &keyorder.LimitError{Limit: fmt.Sprintf("header %q value length", k), Max: lim.MaxHeaderValueBytes, Got: len(v), Backend: b}
		}
		total += len(k) + len(v)
	}
	if lim.MaxHeaderBytes > 0 && total > lim.MaxHeaderBytes {
		return &keyorder.LimitError{Limit: "header bytes", Max: lim.MaxHeaderBytes, Got: total, Backend: b}
	}
	if lim.Check != nil {
		c := CheckMessage(m)
		if c.ID == "" {
			c.ID = "00000000-0000-7000-8000-000000000000"
		}
		if err := lim.Check(c); err != nil {
			if le, ok := err.(*keyorder.LimitError); ok {
				return le
			}
			return &keyorder.LimitError{Limit: err.Error(), Backend: b}
		}
	}
	return nil
}

// CheckMessage returns m as Limits.Check sees it: the fields that are sent,
// with the headers as they are (no partition-key header added). Drivers
// use it to apply their Check on send.
func CheckMessage(m *Message) *keyorder.Message {
	return &keyorder.Message{ID: m.ID, Key: m.Key, Payload: m.Payload, Headers: m.Headers, NotBefore: m.NotBefore}
}
