package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/warren-sandbox/warren/internal/api/gen"
	"github.com/warren-sandbox/warren/internal/reqid"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
)

// The lifecycle endpoints: pause, resume, fork, snapshots. What they do is
// internal/sandbox's (and internal/template's for snapshots, which are
// templates).

func (s *Server) PauseSandbox(w http.ResponseWriter, r *http.Request, id gen.SandboxID) {
	var body gen.PauseSandbox
	if !readJSON(w, r, &body, true) {
		return
	}
	if s.overDiskQuota(w, r, 0, "the pause") {
		return
	}
	paused, err := s.cfg.Sandboxes.Pause(r.Context(), teamIDOf(r), id, body.Memory == nil || *body.Memory)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !paused {
		// The SDK reads this code from the body as "already paused".
		writeError(w, http.StatusConflict, fmt.Sprintf("sandbox %s is already paused", id))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) ResumeSandbox(w http.ResponseWriter, r *http.Request, id gen.SandboxID) {
	var body gen.ResumedSandbox
	if !readJSON(w, r, &body, true) {
		return
	}
	timeout, err := s.seconds(body.Timeout, sandbox.DefaultResumeTimeout, "timeout")
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	rec, err := s.cfg.Sandboxes.ResumeSandbox(r.Context(), teamIDOf(r), id, sandbox.ResumeOptions{
		Timeout: timeout, AutoPause: body.AutoPause, Memory: body.Memory == nil || *body.Memory,
	})
	if err != nil {
		s.failStart(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.sandboxOf(rec))
}

// resumeFailed answers a resume that failed: a 500 that says which step
// failed and that the sandbox is still paused, so that the caller knows
// to retry (the detail, which may name host paths, goes to the log).
func (s *Server) resumeFailed(w http.ResponseWriter, r *http.Request, re *sandbox.ResumeError) {
	id := requestID(r)
	s.log.ErrorContext(r.Context(), "resume failed", "sandbox", re.ID, "step", re.Step, "err", re.Err)
	writeErrorCode(w, http.StatusInternalServerError, CodeCreateFailed, placePrefix+fmt.Sprintf(
		"sandbox %s could not be resumed: %s failed; it is still paused and can be resumed again (request %s)", re.ID, re.Step, id))
}

func (s *Server) ForkSandbox(w http.ResponseWriter, r *http.Request, id gen.SandboxID) {
	var body gen.ForkSandbox
	if !readJSON(w, r, &body, true) {
		return
	}
	count := 1
	if body.Count != nil {
		count = int(*body.Count)
	}
	if count < 1 || count > sandbox.MaxForkCount {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("count must be between 1 and %d", sandbox.MaxForkCount))
		return
	}
	timeout, err := s.seconds(body.Timeout, sandbox.DefaultResumeTimeout, "timeout")
	if err == nil && timeout <= 0 {
		err = errors.New("timeout must be greater than 0")
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	// The node checks its own disk for the fork's checkpoint.
	results, err := s.cfg.Sandboxes.Fork(r.Context(), teamIDOf(r), id, timeout, count)
	if err != nil {
		s.failStart(w, r, err)
		return
	}
	out := make([]gen.SandboxForkResult, len(results))
	for i, res := range results {
		if res.Err != nil {
			e := s.errorOf(r, res.Err)
			out[i].Error = &e
			continue
		}
		sb := s.sandboxOf(res.Sandbox)
		out[i].Sandbox = &sb
	}
	writeJSON(w, http.StatusCreated, out)
}

// errorOf is the error body fail would answer err with, for a result
// inside a response (a fork's); an internal error is logged under the
// request's ID and says only that.
func (s *Server) errorOf(r *http.Request, err error) gen.Error {
	status, msg := statusOf(err)
	if status == http.StatusInternalServerError {
		id := requestID(r)
		s.log.ErrorContext(r.Context(), "API request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		msg = reqid.InternalMessage(id)
	}
	e := gen.Error{Code: int32(status), Message: msg}
	// A fork is a start: its results carry E2B's codes as a create's.
	if st, code, ok := startCode(r, err); ok && st == status {
		e.ErrorCode = &code
	}
	return e
}

// statusOf maps the sandbox manager's errors to a status and message
// (500 for anything else).
func statusOf(err error) (int, string) {
	switch {
	case errors.Is(err, sandbox.ErrNotFound), errors.Is(err, sandbox.ErrTemplateNotFound):
		return http.StatusNotFound, err.Error()
	case errors.Is(err, sandbox.ErrInvalid):
		return http.StatusBadRequest, err.Error()
	case errors.Is(err, sandbox.ErrConflict):
		return http.StatusConflict, err.Error()
	case errors.Is(err, sandbox.ErrTeamLimit):
		return http.StatusTooManyRequests, err.Error()
	case errors.Is(err, sandbox.ErrDiskFull):
		return http.StatusInsufficientStorage, err.Error()
	case errors.Is(err, sandbox.ErrNoCapacity):
		return http.StatusServiceUnavailable, err.Error()
	case store.Unavailable(err):
		return http.StatusServiceUnavailable, "the store is unavailable for a moment, please retry"
	}
	return http.StatusInternalServerError, ""
}

func (s *Server) CreateSnapshot(w http.ResponseWriter, r *http.Request, id gen.SandboxID) {
	var body gen.NewSnapshot
	if !readJSON(w, r, &body, true) {
		return
	}
	if s.diskFull(w, r) || s.overDiskQuota(w, r, 0, "the snapshot") {
		return
	}
	b, ok := s.templates(w)
	if !ok {
		return
	}
	ref, err := b.CreateSnapshot(r.Context(), teamOf(r), "", id, deref(body.Name))
	if err != nil {
		s.failSnapshot(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, gen.SnapshotInfo{SnapshotID: ref.SnapshotID, Names: ref.Names})
}

// failSnapshot maps the errors of a snapshot: the sandbox manager's or
// the template service's.
func (s *Server) failSnapshot(w http.ResponseWriter, r *http.Request, err error) {
	if status, _ := statusOf(err); status != http.StatusInternalServerError {
		s.fail(w, r, err)
		return
	}
	s.failTemplate(w, r, err)
}

func (s *Server) ListSnapshots(w http.ResponseWriter, r *http.Request, params gen.ListSnapshotsParams) {
	limit := 100
	if params.Limit != nil {
		if *params.Limit < 1 || *params.Limit > 100 {
			writeError(w, http.StatusBadRequest, "limit must be between 1 and 100")
			return
		}
		limit = int(*params.Limit)
	}
	var after *store.Cursor
	if params.NextToken != nil && *params.NextToken != "" {
		c, desc, err := parseToken(*params.NextToken)
		if err != nil || !desc {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid nextToken %q", *params.NextToken))
			return
		}
		after = &c
	}
	for _, p := range []*string{params.SandboxID, params.Name} {
		if p != nil && (len(*p) > 256 || strings.ContainsAny(*p, "\x00")) {
			writeError(w, http.StatusBadRequest, "sandboxID and name are at most 256 characters")
			return
		}
	}
	b, ok := s.templates(w)
	if !ok {
		return
	}
	refs, err := b.ListSnapshots(r.Context(), teamOf(r), deref(params.SandboxID), deref(params.Name), limit+1, after)
	if err != nil {
		s.failTemplate(w, r, err)
		return
	}
	if len(refs) > limit {
		refs = refs[:limit]
		last := refs[limit-1].Template
		w.Header().Set("X-Next-Token", makeToken(store.Cursor{StartedAt: last.CreatedAt, ID: last.ID}, true))
	}
	out := make([]gen.SnapshotInfo, 0, len(refs))
	for _, ref := range refs {
		out = append(out, gen.SnapshotInfo{SnapshotID: ref.SnapshotID, Names: ref.Names})
	}
	writeJSON(w, http.StatusOK, out)
}
