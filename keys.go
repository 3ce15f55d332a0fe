package keyorder

// This file: composite ordering keys and the fairness key.

import (
	"errors"
	"fmt"
	"strings"
)

// HeaderFairnessKey is the header that carries a message's fairness key:
// the coarse unit (a tenant, say) that fair scheduling takes turns between
// and that throttles can be keyed by (see package subscribe). It is an
// ordinary header: it travels with the message on every backend and is
// delivered unchanged. A message without it has no fairness key.
const HeaderFairnessKey = "fairness-key"

// KeyFunc derives a message's ordering key from the message (its headers,
// its fairness key, its payload), for a key defined where a publisher is
// mounted (publish.Config.KeyFunc). It returns "" and a nil error for a
// message that has no key, and an error matching ErrMissingKey (a
// *MissingKeyError naming the part) when a part of the key is missing; the
// missing-key policy then decides, as for a message without a key. A
// KeyFunc must be deterministic and must not modify the message.
//
// A key definition is fixed for a subscription's life, like its ordering:
// the groups it defines are what the subscription orders, and redefining
// them over a live backlog preserves neither order — messages already
// queued under the old groups and messages queued under the new ones
// interleave with no rule relating them. Change a key definition only on a
// new topic or subscription, or once the backlog is drained.
type KeyFunc func(m *Message) (string, error)

// KeyPart is one part of a composite key: a name (for errors) and how to
// read its value from a message. A part whose value is absent or empty is
// missing.
type KeyPart struct {
	// Name names the part in a *MissingKeyError, e.g. `header "account"`.
	Name string
	// Value reads the part; ok false (or an empty value) means missing.
	Value func(m *Message) (value string, ok bool)
}

// HeaderPart is the part read from header name.
func HeaderPart(name string) KeyPart {
	return KeyPart{
		Name:  fmt.Sprintf("header %q", name),
		Value: func(m *Message) (string, bool) { v, ok := m.Headers[name]; return v, ok },
	}
}

// FairnessKeyPart is the part read from the fairness key
// (HeaderFairnessKey).
func FairnessKeyPart() KeyPart {
	return KeyPart{
		Name:  "fairness key",
		Value: func(m *Message) (string, bool) { v, ok := m.Headers[HeaderFairnessKey]; return v, ok },
	}
}

// CompositeKey returns the KeyFunc that reads parts in order and joins
// their values with JoinKey, e.g. CompositeKey(FairnessKeyPart(),
// HeaderPart("account")) orders by (tenant, account). A missing part makes
// it return a *MissingKeyError naming the part. With no parts it returns
// "" (no key).
func CompositeKey(parts ...KeyPart) KeyFunc {
	parts = append([]KeyPart(nil), parts...)
	return func(m *Message) (string, error) {
		if len(parts) == 0 {
			return "", nil
		}
		vs := make([]string, len(parts))
		for i, p := range parts {
			v, ok := p.Value(m)
			if !ok || v == "" {
				return "", &MissingKeyError{Part: p.Name}
			}
			vs[i] = v
		}
		return JoinKey(vs...), nil
	}
}

// KeyFromHeaders is CompositeKey over the named headers, in order.
func KeyFromHeaders(names ...string) KeyFunc {
	parts := make([]KeyPart, len(names))
	for i, n := range names {
		parts[i] = HeaderPart(n)
	}
	return CompositeKey(parts...)
}

// JoinKey encodes parts as one ordering key, unambiguously: each part has
// '%' replaced by "%25" and '/' by "%2F", an empty part is written as a
// lone "%", and the parts are joined with '/'. No part is ever written
// empty, so the empty list (no parts) alone gives "" (no key): JoinKey()
// is "" and JoinKey("") is "%". Different part lists never give the same
// key (("a/b") and ("a", "b") give "a%2Fb" and "a/b"; ("") and ("", "")
// give "%" and "%/%"), a key of plain parts stays readable
// ("tenant-7/acct-42"), and SplitKey recovers the parts. A single
// non-empty part without '%' or '/' is its own key.
//
// The lone "%" is not a percent escape, so a URL unescaper fails on it
// rather than misread it; decode with SplitKey.
func JoinKey(parts ...string) string {
	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			b.WriteByte('/')
		}
		if p == "" {
			b.WriteByte('%')
			continue
		}
		for j := 0; j < len(p); j++ {
			switch c := p[j]; c {
			case '%':
				b.WriteString("%25")
			case '/':
				b.WriteString("%2F")
			default:
				b.WriteByte(c)
			}
		}
	}
	return b.String()
}

// ErrBadKeyEncoding reports a key SplitKey cannot decode.
var ErrBadKeyEncoding = errors.New("keyorder: key is not a JoinKey encoding")

// SplitKey returns the parts JoinKey encoded into key; it is JoinKey's
// exact inverse: SplitKey(JoinKey(parts...)) returns parts, and every key
// SplitKey accepts is JoinKey of what it returns. The key "" gives no parts
// (an empty, nil slice). It fails with an error matching ErrBadKeyEncoding
// on a key JoinKey does not produce: an escape other than "%25" or "%2F"
// (or a "%" that is not a whole part), or an empty part ("a//b", "a/").
func SplitKey(key string) ([]string, error) {
	if key == "" {
		return nil, nil
	}
	parts := strings.Split(key, "/")
	for i, p := range parts {
		switch {
		case p == "":
			return nil, fmt.Errorf("%w: part %d is empty (an empty part is written %%)", ErrBadKeyEncoding, i)
		case p == "%":
			parts[i] = ""
			continue
		case strings.IndexByte(p, '%') < 0:
			continue
		}
		var b strings.Builder
		for j := 0; j < len(p); j++ {
			if p[j] != '%' {
				b.WriteByte(p[j])
				continue
			}
			switch {
			case strings.HasPrefix(p[j:], "%25"):
				b.WriteByte('%')
			case strings.HasPrefix(p[j:], "%2F"):
				b.WriteByte('/')
			default:
				return nil, fmt.Errorf("%w: bad escape at byte %d of part %d", ErrBadKeyEncoding, j, i)
			}
			j += 2
		}
		parts[i] = b.String()
	}
	return parts, nil
}

// MissingKeyError reports a composite key with a part missing (see
// KeyFunc). It matches ErrMissingKey.
type MissingKeyError struct {
	// Part names the missing part, e.g. `header "account"`.
	Part string
}

// Error implements error.
func (e *MissingKeyError) Error() string {
	return "keyorder: message has no ordering key: missing " + e.Part
}

// Is reports whether target is ErrMissingKey.
func (e *MissingKeyError) Is(target error) bool { return target == ErrMissingKey }
