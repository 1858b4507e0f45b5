package files

import (
	"bytes"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// Both SDK body variants arrive chunked, never with a Content-Length.
func TestChunkedUploads(t *testing.T) {
	var sawChunked int
	h := NewHandler(openSettings())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TransferEncoding) > 0 && r.TransferEncoding[0] == "chunked" {
			sawChunked++
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	raw := filepath.Join(dir, "raw")
	// io.MultiReader hides the length, so the client sends it chunked.
	r := do(t, "POST", srv.URL+"/files?path="+url.QueryEscape(raw), io.MultiReader(strings.NewReader("chunked raw")),
		map[string]string{"Content-Type": "application/octet-stream"})
	if r.status != 200 {
		t.Fatalf("raw: %d %s", r.status, r.body)
	}
	mp := filepath.Join(dir, "mp")
	body, ct := multipartBody(t, map[string][]byte{mp: []byte("chunked multipart")})
	if r := do(t, "POST", srv.URL+"/files", io.MultiReader(body), map[string]string{"Content-Type": ct}); r.status != 200 {
		t.Fatalf("multipart: %d %s", r.status, r.body)
	}
	if sawChunked != 2 {
		t.Errorf("%d of 2 requests were chunked", sawChunked)
	}
	if b, _ := os.ReadFile(raw); string(b) != "chunked raw" {
		t.Errorf("raw content %q", b)
	}
	if b, _ := os.ReadFile(mp); string(b) != "chunked multipart" {
		t.Errorf("multipart content %q", b)
	}
}

// Filenames are used verbatim: undici leaves '%' alone and sends '"' as
// %22, so decoding would corrupt names. Parts not named "file" are ignored.
func TestMultipartFilenamesVerbatimAndOtherPartsIgnored(t *testing.T) {
	srv, _ := newServer(t, "")
	dir := t.TempDir()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	part := func(disposition, data string) {
		pw, err := mw.CreatePart(textproto.MIMEHeader{"Content-Disposition": {disposition}})
		if err != nil {
			t.Fatal(err)
		}
		pw.Write([]byte(data))
	}
	part(`form-data; name="other"; filename="`+filepath.Join(dir, "other")+`"`, "ignored")
	part(`form-data; name="file"; filename="`+filepath.Join(dir, "100%25 a%22b")+`"`, "pct")
	part(`form-data; name="file"; filename="`+filepath.Join(dir, "sub", "caf\u00e9.txt")+`"`, "utf8")
	mw.Close()
	r := do(t, "POST", srv.URL+"/files", &buf, map[string]string{"Content-Type": mw.FormDataContentType()})
	if r.status != 200 {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	var got []entry
	json.Unmarshal(r.body, &got)
	if len(got) != 2 || got[0].Name != "100%25 a%22b" || got[1].Path != filepath.Join(dir, "sub", "caf\u00e9.txt") {
		t.Errorf("entries %+v", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "other")); !os.IsNotExist(err) {
		t.Error("a part not named file was written")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "100%25 a%22b")); string(b) != "pct" {
		t.Errorf("verbatim name: %q", b)
	}
}

func TestMultipartMetadataOnEveryFileAndBadRequests(t *testing.T) {
	srv, _ := newServer(t, "")
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	body, ct := multipartBody(t, map[string][]byte{a: []byte("1"), b: []byte("2")})
	r := do(t, "POST", srv.URL+"/files", body, map[string]string{"Content-Type": ct, "X-Metadata-Tag": "v1"})
	if r.status != 200 {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	val := make([]byte, 16)
	for _, p := range []string{a, b} {
		if n, err := unix.Getxattr(p, "user.e2b.tag", val); err != nil || string(val[:n]) != "v1" {
			t.Errorf("%s metadata: %q %v", p, val[:n], err)
		}
	}
	empty, ect := multipartBody(t, nil)
	for name, req := range map[string]struct {
		body io.Reader
		hdr  map[string]string
	}{
		"no content type":   {strings.NewReader("x"), nil},
		"no boundary":       {strings.NewReader("x"), map[string]string{"Content-Type": "multipart/form-data"}},
		"no file part":      {empty, map[string]string{"Content-Type": ect}},
		"garbage multipart": {strings.NewReader("not multipart"), map[string]string{"Content-Type": "multipart/form-data; boundary=zz"}},
		"metadata key long": {strings.NewReader("x"), map[string]string{"Content-Type": "application/octet-stream", "X-Metadata-" + strings.Repeat("k", 247): "v"}},
	} {
		if r := do(t, "POST", srv.URL+"/files?path="+url.QueryEscape(filepath.Join(dir, "c")), req.body, req.hdr); r.status != 400 || errorCode(t, r) != 400 {
			t.Errorf("%s: status %d %s", name, r.status, r.body)
		}
	}
}

func TestRawUploadOwnershipSymlinkAndLongName(t *testing.T) {
	srv, _ := newServer(t, "")
	dir := t.TempDir()
	os.Chmod(dir, 0o777)
	post := func(path, data string) result {
		return do(t, "POST", srv.URL+"/files?username=nobody&path="+url.QueryEscape(path), strings.NewReader(data),
			map[string]string{"Content-Type": "application/octet-stream"})
	}
	dst := filepath.Join(dir, "new", "owned")
	if r := post(dst, "x"); r.status != 200 {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	for _, p := range []string{filepath.Dir(dst), dst} {
		fi, _ := os.Stat(p)
		if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != 65534 {
			t.Errorf("%s owned by %d, want nobody", p, uid)
		}
	}
	// Writing to a symlink writes its target and keeps the link.
	target, link := filepath.Join(dir, "target"), filepath.Join(dir, "link")
	os.WriteFile(target, []byte("old"), 0o600)
	os.Symlink(target, link)
	if r := post(link, "through"); r.status != 200 {
		t.Fatalf("symlink: %d %s", r.status, r.body)
	}
	if fi, _ := os.Lstat(link); fi.Mode()&os.ModeSymlink == 0 {
		t.Error("the symlink was replaced")
	}
	if b, _ := os.ReadFile(target); string(b) != "through" {
		t.Errorf("target content %q", b)
	}
	if fi, _ := os.Stat(target); fi.Mode().Perm() != 0o600 {
		t.Errorf("target mode %v, want the old 0600 kept", fi.Mode().Perm())
	}
	// A 255-byte name is legal; its temporary file must be too.
	long := filepath.Join(dir, strings.Repeat("n", 255))
	if r := post(long, "long"); r.status != 200 {
		t.Errorf("255-byte name: %d %s", r.status, r.body)
	}
	if r := post(filepath.Join(dir, strings.Repeat("n", 256)), "x"); r.status != 400 {
		t.Errorf("256-byte name: %d %s", r.status, r.body)
	}
	if r := post(filepath.Join(target, "below-a-file"), "x"); r.status != 400 {
		t.Errorf("parent is a file: %d %s", r.status, r.body)
	}
}

func TestBadPathsAndMethods(t *testing.T) {
	srv, _ := newServer(t, "")
	file := filepath.Join(t.TempDir(), "f")
	os.WriteFile(file, []byte("x"), 0o644)
	if r := do(t, "GET", srv.URL+"/files?path="+url.QueryEscape(file+"/below"), nil, nil); r.status != 400 {
		t.Errorf("path through a file: %d %s", r.status, r.body)
	}
	for _, m := range []string{"PUT", "PATCH", "DELETE"} {
		if r := do(t, m, srv.URL+"/files", nil, nil); r.status != 405 || errorCode(t, r) != 405 {
			t.Errorf("%s /files: %d", m, r.status)
		}
	}
	if r := do(t, "GET", srv.URL+"/files/compose", nil, nil); r.status != 405 {
		t.Errorf("GET /files/compose: %d", r.status)
	}
	if r := do(t, "POST", srv.URL+"/files/compose", strings.NewReader("{"), nil); r.status != 400 {
		t.Errorf("compose bad JSON: %d", r.status)
	}
	if r := do(t, "POST", srv.URL+"/files/compose", strings.NewReader(`{"source_paths":["/nope-xyz"],"destination":"/tmp/x-nope"}`), nil); r.status != 404 {
		t.Errorf("compose missing source: %d", r.status)
	}
}

// A signature binds path, operation and user; the header token, when
// present, decides alone.
func TestSignatureMismatches(t *testing.T) {
	srv, _ := newServer(t, "tok")
	file := filepath.Join(t.TempDir(), "s")
	os.WriteFile(file, []byte("x"), 0o644)
	get := func(query string, hdr map[string]string) int {
		return do(t, "GET", srv.URL+"/files?"+query, nil, hdr).status
	}
	p := url.QueryEscape(file)
	sig := url.QueryEscape(Signature(file, "read", "", "tok", nil))
	if s := get("path="+p+"&signature="+sig, nil); s != 200 {
		t.Errorf("valid: %d", s)
	}
	if s := get("path="+p+"&signature=v1_AAAA", nil); s != 401 {
		t.Errorf("garbage signature: %d", s)
	}
	if s := get("path="+p+"&username=root&signature="+sig, nil); s != 401 {
		t.Errorf("signature for another user: %d", s)
	}
	other := url.QueryEscape(Signature(file+"x", "read", "", "tok", nil))
	if s := get("path="+p+"&signature="+other, nil); s != 401 {
		t.Errorf("signature for another path: %d", s)
	}
	if s := get("path="+p+"&signature="+sig+"&signature_expiration=soon", nil); s != 401 {
		t.Errorf("bad expiration: %d", s)
	}
	if s := get("path="+p+"&signature="+sig, map[string]string{"X-Access-Token": "wrong"}); s != 401 {
		t.Errorf("wrong header with valid signature: %d", s)
	}
	wsig := url.QueryEscape(Signature(file, "write", "nobody", "tok", nil))
	r := do(t, "POST", srv.URL+"/files?path="+p+"&username=nobody&signature="+wsig, strings.NewReader("y"),
		map[string]string{"Content-Type": "application/octet-stream"})
	if r.status != 200 {
		t.Errorf("signed write as nobody: %d %s", r.status, r.body)
	}
	if r := do(t, "POST", srv.URL+"/files/compose", strings.NewReader(`{"source_paths":["a"],"destination":"b"}`), nil); r.status != 401 {
		t.Errorf("compose without token: %d", r.status)
	}
}

func TestComposeOwnership(t *testing.T) {
	srv, _ := newServer(t, "")
	dir := t.TempDir()
	os.Chmod(dir, 0o777)
	a := filepath.Join(dir, "a")
	os.WriteFile(a, []byte("part"), 0o644)
	dst := filepath.Join(dir, "composed")
	body := `{"source_paths":["` + a + `","` + a + `"],"destination":"` + dst + `","username":"nobody"}`
	r := do(t, "POST", srv.URL+"/files/compose", strings.NewReader(body), map[string]string{"Content-Type": "application/json"})
	if r.status != 200 || !strings.Contains(string(r.body), `"type":"file"`) {
		t.Fatalf("compose: %d %s", r.status, r.body)
	}
	if b, _ := os.ReadFile(dst); string(b) != "partpart" {
		t.Errorf("content %q", b)
	}
	if fi, _ := os.Stat(dst); fi.Sys().(*syscall.Stat_t).Uid != 65534 {
		t.Error("composed file not owned by nobody")
	}
}
