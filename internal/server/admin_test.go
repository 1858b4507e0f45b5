package server

import (
	"os"
	"strings"
	"testing"
)

func TestAdminTokenMadeOnceAndPrivate(t *testing.T) {
	dir := t.TempDir()
	tok, err := AdminToken(dir)
	if err != nil || !strings.HasPrefix(tok, AdminTokenPrefix) || len(tok) != len(AdminTokenPrefix)+64 {
		t.Fatalf("AdminToken = %q, %v", tok, err)
	}
	fi, err := os.Stat(adminTokenFile(dir))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", fi, err)
	}
	again, err := AdminToken(dir)
	if err != nil || again != tok {
		t.Errorf("second read: %q, %v; want the same token", again, err)
	}
	if other, _ := AdminToken(t.TempDir()); other == tok {
		t.Error("two data dirs got the same token")
	}
	// A file that holds no token is an error, not a credential.
	if err := os.WriteFile(adminTokenFile(dir), []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, err := AdminToken(dir); err == nil {
		t.Errorf("an empty admin-token file gave %q", tok)
	}
}

func TestAdminAddrIsAListenerOfItsOwn(t *testing.T) {
	for _, c := range []Config{
		{APIAddr: "127.0.0.1:7000", ProxyAddr: "127.0.0.1:7001", AdminAddr: "127.0.0.1:7000"},
		{APIAddr: "127.0.0.1:7000", ProxyAddr: "127.0.0.1:7001", AdminAddr: "127.0.0.1:7001"},
		{APIAddr: "127.0.0.1:7000", ProxyAddr: "127.0.0.1:7001", MetricsAddr: "127.0.0.1:7002", AdminAddr: "127.0.0.1:7002"},
	} {
		if ln, err := listenAdmin(c); err == nil {
			ln.Close()
			t.Errorf("--admin-addr %s beside %+v: accepted", c.AdminAddr, c)
		}
	}
	if ln, err := listenAdmin(Config{}); ln != nil || err != nil {
		t.Errorf("no --admin-addr: %v %v", ln, err)
	}
	ln, err := listenAdmin(Config{APIAddr: "127.0.0.1:0", AdminAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
}
