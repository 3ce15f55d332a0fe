package postgres

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keyorder/keyorder"
)

// IsRetryable reports whether err is transient: a lost or refused
// connection, a server shutting down or restarting, a deadlock or
// serialization failure, or resource exhaustion. Drivers never retry; the
// portable layer does, on this answer.
func IsRetryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), // connection exception
			strings.HasPrefix(pgErr.Code, "53"), // insufficient resources
			pgErr.Code == "40001",               // serialization_failure
			pgErr.Code == "40P01",               // deadlock_detected
			pgErr.Code == "55P03",               // lock_not_available
			pgErr.Code == "57P01",               // admin_shutdown
			pgErr.Code == "57P02",               // crash_shutdown
			pgErr.Code == "57P03":               // cannot_connect_now
			return true
		}
		return false
	}
	var connErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case pgconn.SafeToRetry(err), pgconn.Timeout(err),
		errors.As(err, &connErr), errors.As(err, &netErr),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return true
	}
	// pgx reports a connection that died mid-query as "conn closed" or
	// "unexpected EOF" without a typed error in some paths.
	msg := err.Error()
	return strings.Contains(msg, "conn closed") || strings.Contains(msg, "connection reset") ||
		strings.Contains(msg, "broken pipe") || strings.Contains(msg, "unexpected EOF")
}

// ErrorCode classifies an error returned by this package.
func ErrorCode(err error) keyorder.ErrorCode {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return keyorder.CodeUnknown
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return keyorder.CodeCanceled
	case errors.Is(err, keyorder.ErrNotFound), errors.Is(err, pgx.ErrNoRows):
		return keyorder.CodeNotFound
	case errors.Is(err, keyorder.ErrInvalidMessage), errors.Is(err, keyorder.ErrInvalidConfig):
		return keyorder.CodeInvalidArgument
	case errors.As(err, &pgErr):
		switch {
		case pgErr.Code == "42501" || strings.HasPrefix(pgErr.Code, "28"):
			return keyorder.CodePermissionDenied
		case strings.HasPrefix(pgErr.Code, "53"):
			return keyorder.CodeResourceExhausted
		case strings.HasPrefix(pgErr.Code, "22"), strings.HasPrefix(pgErr.Code, "23"):
			return keyorder.CodeInvalidArgument
		case pgErr.Code == "42P01": // undefined_table: schema not migrated
			return keyorder.CodeFailedPrecondition
		}
	}
	if IsRetryable(err) {
		return keyorder.CodeUnavailable
	}
	return keyorder.CodeUnknown
}
