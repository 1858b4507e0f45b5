package ingress

import (
	"crypto/tls"
	"strings"
	"sync"
	"testing"
)

var (
	fuzzCertsOnce sync.Once
	fuzzCerts     *Certs
)

// FuzzServerName: no server name a client sends panics the server, and a
// certificate is only ever signed for the domain or one label under it,
// for exactly that name in lower case.
func FuzzServerName(f *testing.F) {
	for _, s := range []string{"8000-abc.localhost", "LOCALHOST.", "a.b.localhost", "\u212a.localhost", "", ".", "..localhost",
		"x.localhost.", "-.localhost", strings.Repeat("a", 64) + ".localhost", "8000-abc.localhost\x00.evil", "*.localhost", "xn--k.localhost"} {
		f.Add(s)
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, name string) {
		fuzzCertsOnce.Do(func() {
			var err error
			if fuzzCerts, err = New(Config{Domain: "localhost", DataDir: dir}); err != nil {
				t.Fatal(err)
			}
		})
		cert, err := fuzzCerts.GetCertificate(&tls.ClientHelloInfo{ServerName: name})
		if err != nil {
			return
		}
		got := cert.Leaf.DNSNames
		want := strings.ToLower(strings.TrimSuffix(name, "."))
		if len(got) != 1 || got[0] != want {
			t.Fatalf("server name %q got a leaf for %v", name, got)
		}
		if want != "localhost" {
			label, rest, _ := strings.Cut(want, ".")
			if rest != "localhost" || label == "" || strings.ContainsAny(label, "*_ \x00") {
				t.Fatalf("server name %q got a leaf outside *.localhost: %v", name, got)
			}
		}
	})
}
