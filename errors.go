package keyorder

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors. Typed errors below match them with errors.Is.
var (
	// ErrMissingKey: a message with no ordering key was published under the
	// Reject missing-key policy. Nothing was sent.
	ErrMissingKey = errors.New("keyorder: message has no ordering key")
	// ErrKeyPaused: an earlier publish of this key failed and the key is
	// paused until the application resumes it. Nothing was sent.
	ErrKeyPaused = errors.New("keyorder: ordering key is paused after a failed publish")
	// ErrInvalidMessage: the message breaks a limit of the backend (key too
	// long, payload too large, invalid characters). Nothing was sent.
	ErrInvalidMessage = errors.New("keyorder: invalid message")
	// ErrClosed: the publisher or subscriber was closed.
	ErrClosed = errors.New("keyorder: closed")
	// ErrUnknownScheme: no adapter registered the URL's scheme.
	ErrUnknownScheme = errors.New("keyorder: unknown URL scheme")
	// ErrBadURL: the URL could not be parsed or has an invalid parameter.
	ErrBadURL = errors.New("keyorder: malformed URL")
	// ErrNotFound: a topic, subscription or message does not exist.
	ErrNotFound = errors.New("keyorder: not found")
	// ErrUnsupported: the backend cannot do what was asked.
	ErrUnsupported = errors.New("keyorder: not supported by this backend")
	// ErrInvalidConfig: a configuration value is out of range.
	ErrInvalidConfig = errors.New("keyorder: invalid configuration")

	// The sentinels of backend error codes: a *Error matches the one of its
	// Code (CodeNotFound matches ErrNotFound, CodeInvalidArgument
	// ErrInvalidMessage, CodeUnimplemented ErrUnsupported, CodeCanceled
	// context.Canceled, CodeDeadlineExceeded context.DeadlineExceeded).

	// ErrUnavailable: the broker is unreachable or failed transiently.
	ErrUnavailable = errors.New("keyorder: backend unavailable")
	// ErrFailedPrecondition: the broker's state does not allow the
	// operation (a subscription created with another ordering, say).
	ErrFailedPrecondition = errors.New("keyorder: failed precondition")
	// ErrResourceExhausted: a quota or throughput limit of the broker.
	ErrResourceExhausted = errors.New("keyorder: resource exhausted")
	// ErrPermissionDenied: the credentials do not allow the operation.
	ErrPermissionDenied = errors.New("keyorder: permission denied")
	// ErrBackend: a backend error the driver could not classify
	// (CodeUnknown).
	ErrBackend = errors.New("keyorder: backend error")
)

// LimitError reports a message that breaks a backend limit. It matches
// ErrInvalidMessage.
type LimitError struct {
	// Limit names the limit: "key length", "key is not valid UTF-8",
	// "payload size", "empty payload", "header count", "header bytes",
	// "encoded size ..." (SQS), or the rule a header breaks.
	Limit string
	// Max is the limit's value (bytes or characters), 0 if not numeric.
	Max int
	// Got is the offending value, 0 if not numeric.
	Got int
	// Backend names the backend whose limit it is.
	Backend string
}

// Error implements error.
func (e *LimitError) Error() string {
	if e.Max > 0 {
		return fmt.Sprintf("keyorder: %s %d exceeds the %s limit of %d", e.Limit, e.Got, e.Backend, e.Max)
	}
	return fmt.Sprintf("keyorder: %s: not allowed by %s", e.Limit, e.Backend)
}

// Is reports whether target is ErrInvalidMessage.
func (e *LimitError) Is(target error) bool { return target == ErrInvalidMessage }

// ParamError reports a URL query parameter an opener cannot use: one the
// scheme does not know (a misspelling, most often), or a value it cannot
// take. It matches ErrBadURL; publish.Open and subscribe.Open return it
// wrapped in an error that carries the redacted URL, so errors.As finds
// it:
//
//	var pe *keyorder.ParamError
//	if errors.As(err, &pe) && pe.Suggestion != "" { ... }
type ParamError struct {
	// Param is the parameter as the URL names it ("subscripton").
	Param string
	// Reason says what is wrong with it ("unknown parameter", "want a
	// duration of at least 1s").
	Reason string
	// Suggestion is, for a parameter the scheme does not know, the
	// parameter it declares that is closest to Param ("subscription"); ""
	// when none is close or Param is known.
	Suggestion string
}

// Error implements error; it never holds the parameter's value.
func (e *ParamError) Error() string {
	s := fmt.Sprintf("%v: parameter %q: %s", ErrBadURL, e.Param, e.Reason)
	if e.Suggestion != "" {
		s += fmt.Sprintf(" (did you mean %q?)", e.Suggestion)
	}
	return s
}

// Is reports whether target is ErrBadURL.
func (e *ParamError) Is(target error) bool { return target == ErrBadURL }

// NotDeadLetterError is returned by Redrive when some of the IDs it was
// given are not dead letters of the subscription: never dead-lettered,
// already redriven, or unknown. The others were redriven (the count
// Redrive returns). It matches ErrNotFound.
type NotDeadLetterError struct {
	// IDs are the message IDs that are not dead letters, each once, in
	// the order given.
	IDs []string
}

// Error implements error.
func (e *NotDeadLetterError) Error() string {
	if len(e.IDs) == 1 {
		return fmt.Sprintf("keyorder: %q is not a dead letter of the subscription", e.IDs[0])
	}
	const show = 5
	q := make([]string, 0, show)
	for _, id := range e.IDs[:min(len(e.IDs), show)] {
		q = append(q, fmt.Sprintf("%q", id))
	}
	more := ""
	if len(e.IDs) > show {
		more = fmt.Sprintf(" and %d more", len(e.IDs)-show)
	}
	return fmt.Sprintf("keyorder: %d IDs are not dead letters of the subscription: %s%s", len(e.IDs), strings.Join(q, ", "), more)
}

// Is reports whether target is ErrNotFound.
func (e *NotDeadLetterError) Is(target error) bool { return target == ErrNotFound }

// KeyPausedError is returned by a publish of a paused key. It matches
// ErrKeyPaused and unwraps to the error that paused the key.
type KeyPausedError struct {
	Key   string
	Cause error
}

// Error implements error.
func (e *KeyPausedError) Error() string {
	return fmt.Sprintf("keyorder: key %q is paused after a failed publish: %v", e.Key, e.Cause)
}

// Is reports whether target is ErrKeyPaused.
func (e *KeyPausedError) Is(target error) bool { return target == ErrKeyPaused }

// Unwrap returns the error that paused the key.
func (e *KeyPausedError) Unwrap() error { return e.Cause }

// RetryError asks for a retry not before After. Create it with RetryAfter.
type RetryError struct {
	Err   error
	After time.Duration
}

// RetryAfter wraps err so that the message is retried not before d has
// passed. Under Ordered the message's group is held for d; other groups are
// not. The attempt counts towards MaxAttempts. A negative d (a time.Until
// of a time already past) counts as 0: retry now, with no backoff.
//
// It returns nil when err is nil, so `return keyorder.RetryAfter(err, d)`
// after a successful call acknowledges the message.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &RetryError{Err: err, After: max(d, 0)}
}

// Error implements error.
func (e *RetryError) Error() string {
	return fmt.Sprintf("retry after %v: %v", e.After, e.Err)
}

// Unwrap returns the wrapped error.
func (e *RetryError) Unwrap() error { return e.Err }

// PermanentError marks a failure that must not be retried. Create it with
// Permanent.
type PermanentError struct{ Err error }

// Permanent wraps err so that the message is dead-lettered at once.
//
// It returns nil when err is nil, so `return keyorder.Permanent(err)` after
// a successful call acknowledges the message.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// Error implements error.
func (e *PermanentError) Error() string { return fmt.Sprintf("permanent: %v", e.Err) }

// Unwrap returns the wrapped error.
func (e *PermanentError) Unwrap() error { return e.Err }

// PanicError is the error a recovered handler panic becomes.
type PanicError struct {
	Value any
	Stack []byte
}

// Error implements error.
func (e *PanicError) Error() string { return fmt.Sprintf("handler panic: %v", e.Value) }

// ErrorCode classifies a backend error so the portable layer can decide what
// to do with it without knowing the broker.
type ErrorCode int

// Error codes.
const (
	CodeUnknown ErrorCode = iota
	CodeNotFound
	CodeInvalidArgument
	CodeUnavailable // transient: retry
	CodeCanceled
	CodeFailedPrecondition
	CodeResourceExhausted
	CodePermissionDenied
	CodeUnimplemented
	CodeDeadlineExceeded
)

var codeNames = [...]string{
	CodeUnknown:            "Unknown",
	CodeNotFound:           "NotFound",
	CodeInvalidArgument:    "InvalidArgument",
	CodeUnavailable:        "Unavailable",
	CodeCanceled:           "Canceled",
	CodeFailedPrecondition: "FailedPrecondition",
	CodeResourceExhausted:  "ResourceExhausted",
	CodePermissionDenied:   "PermissionDenied",
	CodeUnimplemented:      "Unimplemented",
	CodeDeadlineExceeded:   "DeadlineExceeded",
}

// String returns the code's name ("NotFound").
func (c ErrorCode) String() string {
	if c >= 0 && int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("ErrorCode(%d)", int(c))
}

// Code returns the code of an error returned by keyorder's portable API,
// like gocloud's gcerrors.Code: the Code of a *Error in its chain, else the
// code of the sentinel it matches (ErrInvalidMessage, ErrMissingKey,
// ErrBadURL, ErrUnknownScheme and ErrInvalidConfig are CodeInvalidArgument;
// ErrKeyPaused and ErrClosed CodeFailedPrecondition; ErrNotFound
// CodeNotFound; ErrUnsupported CodeUnimplemented), CodeCanceled and
// CodeDeadlineExceeded for the context's errors, and CodeUnknown for nil
// and anything else.
func Code(err error) ErrorCode {
	if err == nil {
		return CodeUnknown
	}
	// A paused key unwraps to the error that paused it: the pause is what
	// this call failed on.
	if errors.Is(err, ErrKeyPaused) || errors.Is(err, ErrClosed) {
		return CodeFailedPrecondition
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	for _, sc := range sentinelCodes {
		if errors.Is(err, sc.err) {
			return sc.code
		}
	}
	return CodeUnknown
}

var sentinelCodes = []struct {
	err  error
	code ErrorCode
}{
	{ErrInvalidMessage, CodeInvalidArgument},
	{ErrMissingKey, CodeInvalidArgument},
	{ErrBadURL, CodeInvalidArgument},
	{ErrUnknownScheme, CodeInvalidArgument},
	{ErrInvalidConfig, CodeInvalidArgument},
	{ErrNotFound, CodeNotFound},
	{ErrUnsupported, CodeUnimplemented},
	{ErrUnavailable, CodeUnavailable},
	{ErrFailedPrecondition, CodeFailedPrecondition},
	{ErrResourceExhausted, CodeResourceExhausted},
	{ErrPermissionDenied, CodePermissionDenied},
	{context.Canceled, CodeCanceled},
	{context.DeadlineExceeded, CodeDeadlineExceeded},
}

// Error is a backend error wrapped once by the portable layer. It unwraps to
// both the driver's error (errors.As with the SDK's types works) and the
// sentinel of its code (errors.Is(err, ErrNotFound)); every code has one, so
// every backend error matches a keyorder sentinel.
type Error struct {
	Code ErrorCode
	Op   string
	Err  error
}

// Unwrap returns the driver error and the code's sentinel, if any.
func (e *Error) Unwrap() []error { return []error{e.Err, sentinelFor(e.Code)} }

// Error implements error.
func (e *Error) Error() string {
	return fmt.Sprintf("keyorder: %s: %s: %v", e.Op, e.Code, e.Err)
}

func sentinelFor(c ErrorCode) error {
	switch c {
	case CodeNotFound:
		return ErrNotFound
	case CodeInvalidArgument:
		return ErrInvalidMessage
	case CodeUnavailable:
		return ErrUnavailable
	case CodeCanceled:
		return context.Canceled
	case CodeFailedPrecondition:
		return ErrFailedPrecondition
	case CodeResourceExhausted:
		return ErrResourceExhausted
	case CodePermissionDenied:
		return ErrPermissionDenied
	case CodeUnimplemented:
		return ErrUnsupported
	case CodeDeadlineExceeded:
		return context.DeadlineExceeded
	}
	return ErrBackend
}
