package users

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestResolvePath(t *testing.T) {
	u := &User{Name: "user", Home: "/home/user"}
	for _, c := range []struct{ p, workdir, want string }{
		{"", "", "/home/user"},
		{"", "/srv/app", "/srv/app"},
		{"", "app/", "/home/user/app"},
		{"~", "/srv", "/home/user"},
		{"~/a/../b", "", "/home/user/b"},
		{"~user/x", "", "/home/user/~user/x"}, // no ~name expansion, as in E2B
		{"a/b", "/srv", "/home/user/a/b"},
		{"../../../etc/passwd", "", "/etc/passwd"},
		{"/etc//passwd/", "", "/etc/passwd"},
		{"/..", "", "/"},
		{"./", "", "/home/user"},
	} {
		if got := u.ResolvePath(c.p, c.workdir); got != c.want {
			t.Errorf("ResolvePath(%q, %q) = %q, want %q", c.p, c.workdir, got, c.want)
		}
	}
	// An account whose home is missing or relative in /etc/passwd.
	for home, want := range map[string]string{"": "/x", "rel/home": "/rel/home/x", "/a/../b/": "/b/x"} {
		if got := (&User{Home: home}).ResolvePath("x", ""); got != want {
			t.Errorf("home %q: %q, want %q", home, got, want)
		}
	}
}

// FuzzResolvePath: whatever a request and the account hold, the path envd
// acts on is absolute and clean, an absolute request path is taken as it
// is (cleaned), and "~/" paths stay under the home.
func FuzzResolvePath(f *testing.F) {
	for _, s := range [][3]string{
		{"", "", "/home/user"}, {"~", "", "/root"}, {"~/../../etc", "", "/home/user"},
		{"../../x", "rel", ""}, {"/a/./b//c/..", "/w", "/h"}, {"a\x00b", "", "/h"},
		{"~user", "~", "~"}, {"//", "..", "."}, {strings.Repeat("../", 50), "", "/h"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, p, workdir, home string) {
		u := &User{Name: "fuzz", Home: home}
		got := u.ResolvePath(p, workdir)
		if !filepath.IsAbs(got) || filepath.Clean(got) != got {
			t.Fatalf("ResolvePath(%q, %q) with home %q = %q: not absolute and clean", p, workdir, home, got)
		}
		if filepath.IsAbs(p) && got != filepath.Clean(p) {
			t.Fatalf("absolute %q resolved to %q", p, got)
		}
		h := u.home()
		if strings.HasPrefix(p, "~/") && !strings.Contains(p, "..") && got != h && !strings.HasPrefix(got, strings.TrimSuffix(h, "/")+"/") {
			t.Fatalf("%q resolved to %q, outside the home %q", p, got, h)
		}
	})
}
