// Package team is a team's identity as the sandbox layers take it. An
// ID is never empty: it is made only by Parse (or MustParse), which
// refuses an empty or malformed ID, so that a call into the sandbox
// manager or the dispatcher cannot name "no team" or "any team" by
// accident, as an empty string could. The platform API makes one from
// the team of an authenticated request, a node from the team a
// NodeService call names.
//
// The zero ID (a variable declared and never set) is the one way left to
// have an ID without a team: it matches nothing (its Scope is
// store.ForTeam(""), which covers no sandbox), and the sandbox layers
// refuse it. The server's own work over every team's sandboxes (the
// reaper, the reconciler, a node's drain and its start) takes no ID at
// all: it says store.AllTeams().
package team

import (
	"errors"
	"fmt"

	"github.com/warren-sandbox/warren/internal/store"
)

// MaxLen bounds an ID's length, in bytes.
const MaxLen = 64

// ErrInvalid is the error of an empty or malformed team ID.
var ErrInvalid = errors.New("invalid team ID")

// ID is one team's identity: an ID Parse accepted.
type ID struct {
	id string
}

// Parse makes the ID of team s: 1 to MaxLen of the letters, digits, '-'
// and '_' (the IDs Warren gives teams: "default", and an operator's
// a-z, 0-9 and '-'). Anything else, the empty string first, is
// ErrInvalid.
func Parse(s string) (ID, error) {
	if s == "" {
		return ID{}, fmt.Errorf("%w: the team ID is empty", ErrInvalid)
	}
	if len(s) > MaxLen {
		return ID{}, fmt.Errorf("%w: the team ID is %d bytes, over %d", ErrInvalid, len(s), MaxLen)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return ID{}, fmt.Errorf("%w: the team ID %q has %q, not a letter, digit, '-' or '_'", ErrInvalid, s, c)
		}
	}
	return ID{id: s}, nil
}

// MustParse is Parse for IDs written in the program (tests, the default
// team): it panics on an ID Parse refuses.
func MustParse(s string) ID {
	t, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return t
}

// String is the ID as stored: "" for the zero ID only.
func (t ID) String() string { return t.id }

// IsZero reports whether t is the zero ID, which names no team.
func (t ID) IsZero() bool { return t.id == "" }

// Scope is the store's scope of t's sandboxes: store.ForTeam of it,
// which for the zero ID matches nothing.
func (t ID) Scope() store.TeamScope { return store.ForTeam(t.id) }

// Owns reports whether a resource of team owner is t's: never for the
// zero ID, whatever owner is.
func (t ID) Owns(owner string) bool { return t.id != "" && owner == t.id }
