package api

import (
	"context"
	"errors"
	"net/http"

	"github.com/warren-sandbox/warren/internal/api/gen"
	"github.com/warren-sandbox/warren/internal/reqid"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

// E2B's error_code values (its Error schema: an open set of
// machine-readable causes). E2B sends them when a sandbox cannot be
// placed or started: on creates, and on the resumes behind resume,
// connect and fork; so does Warren. Elsewhere errors carry none.
const (
	CodeCapacityUnavailable = "sandbox_capacity_unavailable" // 503: no node has room now
	CodePlacementTimeout    = "sandbox_placement_timeout"    // 504: the start ran out of time
	CodeCreateFailed        = "sandbox_create_failed"        // 500: a node tried and failed
	CodeInternal            = "internal_server_error"        // 500: a failure before any node tried (a panic)
)

// placePrefix starts the message of every coded start failure, as E2B's
// do: clients may match on it (e2b-dev/infra placement_errors.go).
const placePrefix = "Failed to place sandbox: "

func writeErrorCode(w http.ResponseWriter, status int, code, msg string) {
	e := gen.Error{Code: int32(status), Message: msg}
	if code != "" {
		e.ErrorCode = &code
	}
	writeJSON(w, status, e)
}

// startCode is the status and error_code of a failure to start a
// sandbox, when E2B names its cause; ok is false for the failures fail
// answers as it does for every other call (a missing template, a bad
// request, a full disk, a gone client...).
func startCode(r *http.Request, err error) (status int, code string, ok bool) {
	var re *sandbox.ResumeError
	switch {
	case errors.As(err, &re):
		return http.StatusInternalServerError, CodeCreateFailed, true
	case errors.Is(err, sandbox.ErrDiskFull):
		return 0, "", false // 507, which E2B has no code for
	case errors.Is(err, sandbox.ErrNoCapacity), errors.Is(err, sandbox.ErrNodeUnavailable):
		return http.StatusServiceUnavailable, CodeCapacityUnavailable, true
	case errors.Is(err, context.DeadlineExceeded) && r.Context().Err() == nil:
		return http.StatusGatewayTimeout, CodePlacementTimeout, true
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		return 0, "", false
	}
	if status, _ := statusOf(err); status != http.StatusInternalServerError ||
		errors.Is(err, sandbox.ErrVolumeNotFound) {
		return 0, "", false
	}
	return http.StatusInternalServerError, CodeCreateFailed, true
}

// failStart answers a failure to start a sandbox (create, resume,
// connect, fork) with E2B's status and error_code.
func (s *Server) failStart(w http.ResponseWriter, r *http.Request, err error) {
	status, code, ok := startCode(r, err)
	if !ok {
		s.fail(w, r, err)
		return
	}
	var re *sandbox.ResumeError
	switch {
	case errors.As(err, &re):
		s.resumeFailed(w, r, re)
	case status == http.StatusInternalServerError:
		s.log.ErrorContext(r.Context(), "API request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		writeErrorCode(w, status, code, placePrefix+"sandbox creation failed, please retry; "+reqid.InternalMessage(requestID(r)))
	case status == http.StatusGatewayTimeout:
		s.log.WarnContext(r.Context(), "sandbox start timed out", "method", r.Method, "path", r.URL.Path, "err", err)
		writeErrorCode(w, status, code, placePrefix+"placement timed out, please retry")
	default:
		writeErrorCode(w, status, code, placePrefix+err.Error())
	}
}
