package files

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/envd/settings"
)

// A signed write URL is for one file: it must not unlock /files/compose,
// whose body names any paths and any user (it would move or delete any
// file as root). Compose takes the access token header only, as in E2B's
// envd.
func TestComposeRefusesSignedURL(t *testing.T) {
	srv, _ := newServer(t, "tok")
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	os.WriteFile(victim, []byte("precious"), 0o644)
	stolen := filepath.Join(dir, "stolen")
	upload := filepath.Join(dir, "upload.txt")
	body := `{"source_paths":["` + victim + `"],"destination":"` + stolen + `","username":"root"}`

	exp := time.Now().Add(time.Hour).Unix()
	for name, query := range map[string]string{
		"signature for the upload file":  "path=" + url.QueryEscape(upload) + "&signature=" + url.QueryEscape(Signature(upload, "write", "", "tok", nil)),
		"signature with expiry and user": fmt.Sprintf("path=%s&username=root&signature=%s&signature_expiration=%d", url.QueryEscape(upload), url.QueryEscape(Signature(upload, "write", "root", "tok", &exp)), exp),
		"signature for the victim":       "path=" + url.QueryEscape(victim) + "&signature=" + url.QueryEscape(Signature(victim, "write", "", "tok", nil)),
		"signature for the destination":  "path=" + url.QueryEscape(stolen) + "&signature=" + url.QueryEscape(Signature(stolen, "write", "", "tok", nil)),
		"no credentials":                 "",
	} {
		r := do(t, "POST", srv.URL+"/files/compose?"+query, strings.NewReader(body), map[string]string{"Content-Type": "application/json"})
		if r.status != 401 || errorCode(t, r) != 401 {
			t.Errorf("%s: compose answered %d %s, want 401", name, r.status, r.body)
		}
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "precious" {
		t.Fatalf("the victim was touched: %q %v", b, err)
	}
	if _, err := os.Stat(stolen); !os.IsNotExist(err) {
		t.Fatalf("the destination was written: %v", err)
	}
	// A wrong header fails; the right one composes.
	if r := do(t, "POST", srv.URL+"/files/compose", strings.NewReader(body), map[string]string{"X-Access-Token": "tok!"}); r.status != 401 {
		t.Errorf("wrong token: %d %s", r.status, r.body)
	}
	if r := do(t, "POST", srv.URL+"/files/compose", strings.NewReader(body), map[string]string{"X-Access-Token": "tok"}); r.status != 200 {
		t.Errorf("right token: %d %s", r.status, r.body)
	}
	if b, _ := os.ReadFile(stolen); string(b) != "precious" {
		t.Errorf("composed %q", b)
	}
}

// Without a token (and without --insecure-no-token) /files serves nothing:
// not with an empty header, and not with a signature keyed by the empty
// token, which anyone can compute.
func TestNoTokenRefusesEverything(t *testing.T) {
	srv, s := newServer(t, "tok")
	empty := ""
	s.Apply(settings.Update{AccessToken: &empty})
	file := filepath.Join(t.TempDir(), "f")
	os.WriteFile(file, []byte("x"), 0o644)
	p := url.QueryEscape(file)
	for _, c := range []struct {
		method, query string
		hdr           map[string]string
	}{
		{"GET", "path=" + p, nil},
		{"GET", "path=" + p, map[string]string{"X-Access-Token": ""}},
		{"GET", "path=" + p + "&signature=" + url.QueryEscape(Signature(file, "read", "", "", nil)), nil},
		{"POST", "path=" + p + "&signature=" + url.QueryEscape(Signature(file, "write", "", "", nil)), map[string]string{"Content-Type": "application/octet-stream"}},
		{"POST", "path=" + p, map[string]string{"Content-Type": "application/octet-stream", "X-Access-Token": "x"}},
	} {
		r := do(t, c.method, srv.URL+"/files?"+c.query, strings.NewReader("overwritten"), c.hdr)
		if r.status != 401 || errorCode(t, r) != 401 {
			t.Errorf("%s ?%s %v: %d %s, want 401", c.method, c.query, c.hdr, r.status, r.body)
		}
	}
	r := do(t, "POST", srv.URL+"/files/compose", strings.NewReader(`{"source_paths":["`+file+`"],"destination":"`+file+`.2"}`), nil)
	if r.status != 401 {
		t.Errorf("compose: %d %s", r.status, r.body)
	}
	if b, _ := os.ReadFile(file); string(b) != "x" {
		t.Errorf("file changed to %q", b)
	}
}
