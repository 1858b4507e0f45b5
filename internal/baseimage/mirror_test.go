package baseimage

import "testing"

func TestMirrorFromDeb822(t *testing.T) {
	for _, c := range []struct{ name, text, want string }{
		{"this machine's kind", `Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
`, "http://deb.debian.org/debian"},
		{"security first, disabled and deb-src skipped", `Types: deb
URIs: http://security.example/debian-security
Suites: bookworm-security
Components: main

Types: deb
URIs: http://disabled.example/debian
Suites: bookworm
Enabled: no

Types: deb-src
URIs: http://src.example/debian
Suites: bookworm

Types: deb deb-src
URIs:
 http://mirror.example/debian
Suites: bookworm
`, "http://mirror.example/debian"},
		{"none", "Types: deb\nURIs: cdrom:/x\nSuites: bookworm\n", ""},
	} {
		if got := mirrorFromDeb822(c.text); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}

func TestMirrorFromList(t *testing.T) {
	text := `# deb http://commented.example/debian bookworm main
deb-src http://src.example/debian bookworm main
deb http://security.debian.org/debian-security bookworm-security main
deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://mirror.example/debian bookworm main
`
	if got := mirrorFromList(text); got != "http://mirror.example/debian" {
		t.Errorf("got %q", got)
	}
}
