package noderpc

import (
	"errors"
	"fmt"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
)

// kindHeader names the sandbox manager's error kind in an error's
// metadata, so that the api answers a node's refusal as the node's own
// API would (404, 409, 503...).
const kindHeader = "Warren-Error-Kind"

// kinds are the sandbox manager's errors that cross the RPC, with the
// Connect code each travels as.
var kinds = []struct {
	name string
	err  error
	code connect.Code
}{
	{"not_found", sandbox.ErrNotFound, connect.CodeNotFound},
	{"template_not_found", sandbox.ErrTemplateNotFound, connect.CodeNotFound},
	{"volume_not_found", sandbox.ErrVolumeNotFound, connect.CodeNotFound},
	{"invalid", sandbox.ErrInvalid, connect.CodeInvalidArgument},
	{"disk_full", sandbox.ErrDiskFull, connect.CodeResourceExhausted}, // before no_capacity, which it comes with
	{"no_capacity", sandbox.ErrNoCapacity, connect.CodeResourceExhausted},
	{"team_limit", sandbox.ErrTeamLimit, connect.CodeResourceExhausted},
	{"conflict", sandbox.ErrConflict, connect.CodeFailedPrecondition},
	{"node_unavailable", sandbox.ErrNodeUnavailable, connect.CodeUnavailable},
}

// A failed resume travels with its sandbox and step (sandbox.ResumeError:
// the API says what failed).
const (
	resumeKind       = "resume_failed"
	resumeIDHeader   = "Warren-Resume-Sandbox"
	resumeStepHeader = "Warren-Resume-Step"
)

// kindOf is err's kind name, "" for an error of none.
func kindOf(err error) string {
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	return ""
}

// toConnect is the error a handler returns for err.
func toConnect(err error) error {
	if err == nil {
		return nil
	}
	var re *sandbox.ResumeError
	if errors.As(err, &re) {
		ce := connect.NewError(connect.CodeInternal, errors.New(re.Err.Error()))
		ce.Meta().Set(kindHeader, resumeKind)
		ce.Meta().Set(resumeIDHeader, re.ID)
		ce.Meta().Set(resumeStepHeader, re.Step)
		return ce
	}
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			ce := connect.NewError(k.code, errors.New(err.Error()))
			ce.Meta().Set(kindHeader, k.name)
			return ce
		}
	}
	if store.Unavailable(err) {
		// The node's store is down or restarting: the api answers 503.
		ce := connect.NewError(connect.CodeUnavailable, errors.New(err.Error()))
		ce.Meta().Set(kindHeader, storeUnavailableKind)
		return ce
	}
	ce := connect.NewError(connect.CodeInternal, errors.New(err.Error()))
	ce.Meta().Set(kindHeader, internalKind)
	return ce
}

// storeUnavailableKind: store.Unavailable on the node (store.ErrUnavailable
// on the api).
const storeUnavailableKind = "store_unavailable"

// internalKind marks the node's own errors of no known kind: an error
// without a kind did not come from the node's service at all.
const internalKind = "internal"

// RemoteError is a node's error as the api sees it: the node's message,
// and the sandbox manager's error it wraps (errors.Is works).
type RemoteError struct {
	Kind error // nil for an error of no known kind
	Msg  string
}

func (e *RemoteError) Error() string { return e.Msg }
func (e *RemoteError) Unwrap() error { return e.Kind }

// fromKind is the error a kind name and message stand for.
func fromKind(kind, msg string) error {
	for _, k := range kinds {
		if k.name == kind && k.err == sandbox.ErrDiskFull {
			// As the node's: another node may have room.
			return &RemoteError{Kind: errors.Join(sandbox.ErrDiskFull, sandbox.ErrNoCapacity), Msg: msg}
		}
		if k.name == kind {
			return &RemoteError{Kind: k.err, Msg: msg}
		}
	}
	if kind == storeUnavailableKind {
		return &RemoteError{Kind: store.ErrUnavailable, Msg: msg}
	}
	return &RemoteError{Msg: msg}
}

// fromConnect is a client call's error as the api handles it: the
// node's own errors as the sandbox manager's; any other (the node died
// mid-call, refused the cluster's credentials, or did not answer at all)
// as sandbox.ErrNodeUnavailable.
func fromConnect(node string, err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return &RemoteError{Kind: sandbox.ErrNodeUnavailable, Msg: "node " + node + " is unavailable: " + err.Error()}
	}
	switch kind := ce.Meta().Get(kindHeader); kind {
	case resumeKind:
		return &sandbox.ResumeError{ID: ce.Meta().Get(resumeIDHeader), Step: ce.Meta().Get(resumeStepHeader), Err: errors.New(ce.Message())}
	case internalKind:
		return &RemoteError{Msg: "node " + node + ": " + ce.Message()}
	case "":
		return &RemoteError{Kind: sandbox.ErrNodeUnavailable, Msg: "node " + node + " is unavailable: " + ce.Message()}
	default:
		return fromKind(kind, ce.Message())
	}
}

func sandboxInvalid(msg string) error { return fmt.Errorf("%w: %s", sandbox.ErrInvalid, msg) }
