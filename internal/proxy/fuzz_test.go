package proxy

import (
	"net/http"
	"testing"
)

// FuzzParseRoute: whatever the host and headers, ParseRoute never panics,
// and a route it returns has a valid sandbox ID and a port in 1..65535.
func FuzzParseRoute(f *testing.F) {
	for _, seed := range []struct {
		domain, host, id, port string
		headers                uint8
	}{
		{"localhost", "8000-sbx1.localhost:3002", "", "", 0},
		{"localhost", "49983-abcdefghij0123456789.localhost.", "", "", 0},
		{"localhost", "0-sbx1.localhost", "", "", 0},
		{"localhost", "65536-sbx1.localhost", "", "", 0},
		{"localhost", "8000-SBX1.LOCALHOST", "", "", 0},
		{"localhost", "8000-\u212Abx1.localhost", "", "", 0},
		{"localhost", "[::1]:3002", "", "", 0},
		{"localhost", "a.8000-sbx1.localhost", "", "", 0},
		{"e2b.example.com", "8000-sbx1.e2b.example.com", "", "", 0},
		{"", "8000-sbx1", "", "", 0},
		{"localhost", "", "sbx1", "49983", 3},
		{"localhost", "", "sbx1", "+1", 3},
		{"localhost", "", "SBX1", "00080", 3},
		{"localhost", "", "sbx1", "", 1},
		{"localhost", "", "", "80", 2},
		{"localhost", "", "sbx1", "80", 7},
	} {
		f.Add(seed.domain, seed.host, seed.id, seed.port, seed.headers)
	}
	f.Fuzz(func(t *testing.T, domain, host, id, port string, headers uint8) {
		h := http.Header{}
		if headers&1 != 0 {
			h.Add("E2b-Sandbox-Id", id)
		}
		if headers&2 != 0 {
			h.Add("E2b-Sandbox-Port", port)
		}
		if headers&4 != 0 {
			h.Add("E2b-Sandbox-Port", port) // twice
		}
		gotID, gotPort, err := ParseRoute(domain, host, h)
		if err != nil {
			return
		}
		if !ValidSandboxID(gotID) || gotPort < 1 || gotPort > 65535 {
			t.Fatalf("ParseRoute(%q, %q, %v) = %q, %d", domain, host, h, gotID, gotPort)
		}
	})
}
