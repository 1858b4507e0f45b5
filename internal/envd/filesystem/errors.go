package filesystem

import (
	"errors"
	"fmt"
	"io/fs"
	"syscall"

	"connectrpc.com/connect"
)

// fsError turns a filesystem error into the Connect code the SDK maps to the
// right exception (wire contract §9.3): missing → not_found (FileNotFoundError,
// exists() → false), wrong type or bad name → invalid_argument, and so on.
// The message says what was being done; the OS error is appended.
func fsError(err error, format string, args ...any) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err // already classified
	}
	return connect.NewError(errorCode(err), fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), err))
}

func errorCode(err error) connect.Code {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return connect.CodeNotFound
	case errors.Is(err, fs.ErrExist), errors.Is(err, syscall.ENOTEMPTY):
		return connect.CodeAlreadyExists
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		return connect.CodePermissionDenied
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.EINVAL),
		errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.ELOOP):
		return connect.CodeInvalidArgument
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT), errors.Is(err, syscall.EMFILE):
		return connect.CodeResourceExhausted
	default:
		return connect.CodeInternal
	}
}

// invalidArgument is the error for requests that name the wrong kind of
// entry (a file where a directory is needed, and the like).
func invalidArgument(format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, args...))
}
