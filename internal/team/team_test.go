package team

import (
	"errors"
	"strings"
	"testing"
)

// Parse refuses the empty ID and malformed ones; what it accepts reads
// back unchanged.
func TestParse(t *testing.T) {
	for _, bad := range []string{"", " ", "team a", "team/a", "../a", "a.b", "a\x00", "é", "t\n", strings.Repeat("a", MaxLen+1)} {
		got, err := Parse(bad)
		if !errors.Is(err, ErrInvalid) || !got.IsZero() {
			t.Errorf("Parse(%q) = %q, %v; want the zero ID and ErrInvalid", bad, got, err)
		}
	}
	for _, good := range []string{"default", "t1", "team-a", "teamB", "a_b", "0", strings.Repeat("a", MaxLen)} {
		got, err := Parse(good)
		if err != nil || got.String() != good || got.IsZero() {
			t.Errorf("Parse(%q) = %q, %v", good, got, err)
		}
	}
}

func TestMustParsePanicsOnEmpty(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("MustParse(\"\") did not panic")
		}
	}()
	MustParse("")
}

// The zero ID matches nothing: no resource is its, not even one of an
// empty team, and its store scope covers no sandbox.
func TestZeroMatchesNothing(t *testing.T) {
	var zero ID
	if !zero.IsZero() || zero.String() != "" {
		t.Errorf("zero = %q", zero)
	}
	for _, owner := range []string{"", "t1", "default"} {
		if zero.Owns(owner) {
			t.Errorf("the zero ID owns %q's", owner)
		}
		if zero.Scope().Covers(owner) {
			t.Errorf("the zero ID's scope covers %q's", owner)
		}
	}
	if !zero.Scope().None() || zero.Scope().All() {
		t.Errorf("the zero ID's scope is not none: %+v", zero.Scope())
	}
	t1 := MustParse("t1")
	if !t1.Owns("t1") || t1.Owns("t2") || t1.Owns("") {
		t.Error("t1 owns the wrong resources")
	}
	if s := t1.Scope(); !s.Covers("t1") || s.Covers("t2") || s.All() || s.None() {
		t.Errorf("t1's scope = %+v", s)
	}
	if t1 == (ID{}) || t1 != MustParse("t1") {
		t.Error("IDs do not compare as their strings")
	}
}
