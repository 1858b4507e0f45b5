// Package users resolves the system user a request runs as and the paths it
// names, the way E2B's envd does: the user comes from an
// "Authorization: Basic base64(<user>:)" header or a username parameter,
// falling back to the sandbox's default user; "~" and relative paths resolve
// against that user's home directory; files envd creates belong to that user.
package users

import (
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrUnknownUser is wrapped by Lookup when no such system user exists.
var ErrUnknownUser = errors.New("unknown user")

// unknownUser is Lookup's error for a name no account has. Its text is
// E2B's envd's for the same lookup ("error looking up user 'x': user:
// unknown user x"), which /files answers with as it is; the Connect
// services answer with their own (see internal/envd/rpc).
type unknownUser struct {
	name string
	err  error
}

func (e *unknownUser) Error() string {
	return fmt.Sprintf("error looking up user '%s': %v", e.name, e.err)
}

func (e *unknownUser) Is(target error) bool { return target == ErrUnknownUser }

// User is a resolved system account.
type User struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32 // supplementary groups
	Home   string
}

// Lookup finds a system user by name.
func Lookup(name string) (*User, error) {
	u, err := user.Lookup(name)
	if err != nil {
		var unknown user.UnknownUserError
		if errors.As(err, &unknown) {
			return nil, &unknownUser{name: name, err: err}
		}
		return nil, fmt.Errorf("looking up user %q: %w", name, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %q has a non-numeric uid %q", name, u.Uid)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %q has a non-numeric gid %q", name, u.Gid)
	}
	res := &User{Name: u.Username, UID: uint32(uid), GID: uint32(gid), Home: u.HomeDir}
	if gids, err := u.GroupIds(); err == nil {
		for _, g := range gids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil && uint32(n) != res.GID {
				res.Groups = append(res.Groups, uint32(n))
			}
		}
	}
	if res.Home == "" {
		res.Home = "/"
	}
	return res, nil
}

// NameFromBasicAuth extracts the username from an "Authorization" header of the
// form "Basic base64(<user>:<anything>)". It returns "" when the header is
// empty; a malformed header is an error.
func NameFromBasicAuth(header string) (string, error) {
	if header == "" {
		return "", nil
	}
	scheme, rest, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return "", errors.New("authorization header must use the Basic scheme")
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(rest))
	if err != nil {
		return "", fmt.Errorf("authorization header is not valid base64: %w", err)
	}
	name, _, _ := strings.Cut(string(raw), ":")
	return name, nil
}

// Resolve returns the user named, or the default user when name is "".
func Resolve(name, defaultUser string) (*User, error) {
	if name == "" {
		name = defaultUser
	}
	if name == "" {
		name = "root"
	}
	return Lookup(name)
}

// ResolvePath turns a path from a request into an absolute, cleaned path:
// "~" and "~/x" expand to the user's home, relative paths are taken relative
// to the home directory, and "" becomes workdir (or the home when workdir is
// ""; a relative workdir is taken relative to the home too). Whatever p,
// workdir and the account's home directory hold, the result is absolute
// and clean: callers compare it and hand it to the kernel as it is.
func (u *User) ResolvePath(p, workdir string) string {
	home := u.home()
	switch {
	case p == "":
		if workdir == "" {
			return home
		}
		return under(home, workdir)
	case p == "~":
		return home
	case strings.HasPrefix(p, "~/"):
		return filepath.Join(home, p[2:])
	default:
		return under(home, p)
	}
}

// home is the user's home directory, absolute and clean even when
// /etc/passwd says otherwise (an empty or relative home counts from /).
func (u *User) home() string {
	return filepath.Join("/", u.Home)
}

// under resolves p against the absolute directory base.
func under(base, p string) string {
	if filepath.IsAbs(p) {
		return filepath.Clean(p)
	}
	return filepath.Join(base, p)
}

// MkdirAll creates dir and any missing parents; every directory it creates
// belongs to the user. Existing directories are left as they are.
func (u *User) MkdirAll(dir string, perm os.FileMode) error {
	dir = filepath.Clean(dir)
	fi, err := os.Stat(dir)
	if err == nil {
		if !fi.IsDir() {
			return &os.PathError{Op: "mkdir", Path: dir, Err: errors.New("not a directory")}
		}
		return nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := u.MkdirAll(parent, perm); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, perm); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil // made concurrently
		}
		return err
	}
	return u.Chown(dir)
}

// Chown gives path (not following a final symlink) to the user and its
// primary group. It is a no-op when envd is not root and the path is already
// ours, so envd also works unprivileged in development.
func (u *User) Chown(path string) error {
	err := os.Lchown(path, int(u.UID), int(u.GID))
	if err != nil && errors.Is(err, os.ErrPermission) && os.Geteuid() == int(u.UID) {
		return nil
	}
	return err
}
