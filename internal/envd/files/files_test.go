package files

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/envd/settings"
)

func TestSignatureVectors(t *testing.T) {
	exp := int64(1700000000)
	for _, v := range []struct {
		path, op, user, token string
		exp                   *int64
		want                  string
	}{
		{"/home/user/file.txt", "read", "", "secret-token", nil, "v1_HsAw1t9a3uP8lxl8zesVQKbZm/CS9olVUM10CxNU8OM"},
		{"/home/user/file.txt", "write", "root", "secret-token", &exp, "v1_ZfczSIu6yLWOCWPhBBqSlArAengAxLdJ1+iumYyWJ0I"},
		{"/home/user/x.txt", "write", "", "tok123", nil, "v1_2BY9VbUZJvmhg4hCnNHz6AT7MWCG4pmx9rUKO35mI+s"},
	} {
		if got := Signature(v.path, v.op, v.user, v.token, v.exp); got != v.want {
			t.Errorf("Signature(%q,%q,%q) = %s, want %s", v.path, v.op, v.user, got, v.want)
		}
	}
}

// openSettings are the settings of an envd without a token that runs with
// --insecure-no-token, which most tests here use.
func openSettings() *settings.Settings {
	s := settings.New("root", "", "")
	s.AllowNoToken()
	return s
}

// newServer serves /files with token, or open (no token needed) when
// token is "".
func newServer(t *testing.T, token string) (*httptest.Server, *settings.Settings) {
	t.Helper()
	s := settings.New("root", "", token)
	if token == "" {
		s.AllowNoToken()
	}
	h := NewHandler(s)
	mux := http.NewServeMux()
	mux.Handle("/files", h)
	mux.Handle("/files/compose", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, s
}

func multipartBody(t *testing.T, files map[string][]byte) (io.Reader, string) {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for name, data := range files {
		h := make(map[string][]string)
		h["Content-Disposition"] = []string{fmt.Sprintf(`form-data; name="file"; filename="%s"`, name)}
		h["Content-Type"] = []string{"application/octet-stream"}
		pw, err := mw.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		pw.Write(data)
	}
	mw.Close()
	return &buf, mw.FormDataContentType()
}

type result struct {
	status int
	body   []byte
	header http.Header
}

func do(t *testing.T, method, u string, body io.Reader, hdr map[string]string) result {
	t.Helper()
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return result{res.StatusCode, b, res.Header}
}

func errorCode(t *testing.T, r result) int {
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(r.body, &e); err != nil || e.Message == "" {
		t.Errorf("error body %q is not {code,message}", r.body)
	}
	return e.Code
}

func TestMultipartUploadSeveralFilesAsUser(t *testing.T) {
	srv, _ := newServer(t, "")
	dir := t.TempDir()
	os.Chmod(dir, 0o777)
	body, ct := multipartBody(t, map[string][]byte{
		filepath.Join(dir, "a", "b", "one.txt"): []byte("one"),
		filepath.Join(dir, "two.txt"):           []byte("two"),
	})
	r := do(t, "POST", srv.URL+"/files?username=nobody", body, map[string]string{"Content-Type": ct})
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	var got []entry
	if err := json.Unmarshal(r.body, &got); err != nil || len(got) != 2 {
		t.Fatalf("response %s", r.body)
	}
	for _, p := range []string{filepath.Join(dir, "a"), filepath.Join(dir, "a", "b"), filepath.Join(dir, "a", "b", "one.txt"), filepath.Join(dir, "two.txt")} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != 65534 {
			t.Errorf("%s owned by %d, want nobody", p, uid)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "a", "b", "one.txt")); string(b) != "one" {
		t.Errorf("content %q", b)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), ".upload-") {
			t.Errorf("temporary file %s left", e.Name())
		}
	}
}

func TestSingleUploadQueryPathWinsAndRelativePaths(t *testing.T) {
	srv, _ := newServer(t, "")
	name := "warren-files-test-" + filepath.Base(t.TempDir())
	t.Cleanup(func() { os.Remove(filepath.Join("/root", name)) })
	body, ct := multipartBody(t, map[string][]byte{"ignored-name": []byte("x")})
	r := do(t, "POST", srv.URL+"/files?path="+url.QueryEscape(name), body, map[string]string{"Content-Type": ct})
	if r.status != 200 || !strings.Contains(string(r.body), `"/root/`+name+`"`) {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
}

func TestDuplicatePathsRejected(t *testing.T) {
	srv, _ := newServer(t, "")
	dir := t.TempDir()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for i := 0; i < 2; i++ {
		pw, _ := mw.CreateFormFile("file", filepath.Join(dir, "same.txt"))
		pw.Write([]byte("x"))
	}
	mw.Close()
	// CreateFormFile escapes nothing relevant here, but keeps the directory.
	r := do(t, "POST", srv.URL+"/files", &buf, map[string]string{"Content-Type": mw.FormDataContentType()})
	if r.status != 400 || errorCode(t, r) != 400 {
		t.Errorf("duplicate: status %d %s", r.status, r.body)
	}
}

func TestOctetStreamGzipAndMetadata(t *testing.T) {
	srv, _ := newServer(t, "")
	dst := filepath.Join(t.TempDir(), "g.txt")
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("compressed"))
	zw.Close()
	r := do(t, "POST", srv.URL+"/files?path="+url.QueryEscape(dst), &gz, map[string]string{
		"Content-Type": "application/octet-stream", "Content-Encoding": "gzip", "X-Metadata-Owner-Team": "infra",
	})
	if r.status != 200 {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	if b, _ := os.ReadFile(dst); string(b) != "compressed" {
		t.Errorf("content %q", b)
	}
	val := make([]byte, 64)
	n, err := unix.Getxattr(dst, "user.e2b.owner-team", val)
	if err != nil || string(val[:n]) != "infra" {
		t.Errorf("xattr: %q %v", val[:n], err)
	}
	if !strings.Contains(string(r.body), `"metadata":{"owner-team":"infra"}`) {
		t.Errorf("response %s", r.body)
	}
	// A new upload without metadata replaces the set.
	do(t, "POST", srv.URL+"/files?path="+url.QueryEscape(dst), strings.NewReader("plain"), map[string]string{"Content-Type": "application/octet-stream"})
	if _, err := unix.Getxattr(dst, "user.e2b.owner-team", val); err == nil {
		t.Error("metadata survived an upload without metadata")
	}
	for name, hdr := range map[string]map[string]string{
		"no path":           {"Content-Type": "application/octet-stream"},
		"bad encoding":      {"Content-Type": "application/octet-stream", "Content-Encoding": "br"},
		"bad content type":  {"Content-Type": "text/plain"},
		"non-ascii meta":    {"Content-Type": "application/octet-stream", "X-Metadata-K": "caf\u00e9"},
		"metadata too long": {"Content-Type": "application/octet-stream", "X-Metadata-K": strings.Repeat("v", 5000)},
	} {
		q := "?path=" + url.QueryEscape(dst)
		if name == "no path" {
			q = ""
		}
		if r := do(t, "POST", srv.URL+"/files"+q, strings.NewReader("x"), hdr); r.status != 400 {
			t.Errorf("%s: status %d %s", name, r.status, r.body)
		}
	}
	if r := do(t, "POST", srv.URL+"/files?path="+url.QueryEscape(filepath.Dir(dst)), strings.NewReader("x"), map[string]string{"Content-Type": "application/octet-stream"}); r.status != 400 {
		t.Errorf("directory destination: status %d", r.status)
	}
}

func TestDownload(t *testing.T) {
	srv, _ := newServer(t, "")
	dir := t.TempDir()
	file := filepath.Join(dir, "d.txt")
	os.WriteFile(file, []byte("0123456789"), 0o644)
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, nil, 0o644)
	get := func(path string, hdr map[string]string) result {
		return do(t, "GET", srv.URL+"/files?path="+url.QueryEscape(path), nil, hdr)
	}
	if r := get(file, map[string]string{"Accept-Encoding": "gzip, deflate"}); r.status != 200 || string(r.body) != "0123456789" || r.header.Get("Content-Encoding") != "" {
		t.Errorf("plain: %d %q %v", r.status, r.body, r.header)
	}
	r := get(file, map[string]string{"Accept-Encoding": "gzip"})
	zr, err := gzip.NewReader(bytes.NewReader(r.body))
	if err != nil || r.header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("gzip: %v %v", err, r.header)
	}
	if b, _ := io.ReadAll(zr); string(b) != "0123456789" {
		t.Errorf("gzip content %q", b)
	}
	if r := get(file, map[string]string{"Range": "bytes=2-4"}); r.status != 206 || string(r.body) != "234" {
		t.Errorf("range: %d %q", r.status, r.body)
	}
	if r := get(empty, nil); r.status != 200 || r.header.Get("Content-Length") != "0" {
		t.Errorf("empty: %d %v", r.status, r.header)
	}
	if r := get(file, map[string]string{"Accept-Encoding": "identity;q=0"}); r.status != 406 {
		t.Errorf("identity refused: %d", r.status)
	}
	if r := get(filepath.Join(dir, "nope"), nil); r.status != 404 || errorCode(t, r) != 404 {
		t.Errorf("missing: %d %s", r.status, r.body)
	}
	if r := get(dir, nil); r.status != 400 {
		t.Errorf("directory: %d", r.status)
	}
	if r := do(t, "GET", srv.URL+"/files?path=x&username=no-such-user-xyz", nil, nil); r.status != 401 ||
		!strings.Contains(string(r.body), `"error looking up user 'no-such-user-xyz': user: unknown user no-such-user-xyz"`) {
		t.Errorf("unknown user: %d %s", r.status, r.body)
	}
	if r := do(t, "DELETE", srv.URL+"/files?path=x", nil, nil); r.status != 405 {
		t.Errorf("DELETE: %d", r.status)
	}
}

func TestTokenAndSignatures(t *testing.T) {
	srv, _ := newServer(t, "tok")
	dir := t.TempDir()
	file := filepath.Join(dir, "s.txt")
	os.WriteFile(file, []byte("secret"), 0o644)
	base := srv.URL + "/files?path=" + url.QueryEscape(file)
	if r := do(t, "GET", base, nil, nil); r.status != 401 {
		t.Errorf("no token: %d", r.status)
	}
	if r := do(t, "GET", base, nil, map[string]string{"X-Access-Token": "wrong"}); r.status != 401 {
		t.Errorf("wrong token: %d", r.status)
	}
	if r := do(t, "GET", base, nil, map[string]string{"X-Access-Token": "tok"}); r.status != 200 {
		t.Errorf("token: %d", r.status)
	}
	sig := Signature(file, "read", "", "tok", nil)
	if r := do(t, "GET", base+"&signature="+url.QueryEscape(sig), nil, nil); r.status != 200 || string(r.body) != "secret" {
		t.Errorf("signed read: %d %s", r.status, r.body)
	}
	if r := do(t, "POST", base+"&signature="+url.QueryEscape(sig), strings.NewReader("x"), map[string]string{"Content-Type": "application/octet-stream"}); r.status != 401 {
		t.Errorf("read signature used for write: %d", r.status)
	}
	future := time.Now().Add(time.Minute).Unix()
	wsig := Signature(file, "write", "root", "tok", &future)
	q := fmt.Sprintf("&username=root&signature=%s&signature_expiration=%d", url.QueryEscape(wsig), future)
	if r := do(t, "POST", base+q, strings.NewReader("new"), map[string]string{"Content-Type": "application/octet-stream"}); r.status != 200 {
		t.Errorf("signed write: %d %s", r.status, r.body)
	}
	past := time.Now().Add(-time.Minute).Unix()
	psig := Signature(file, "read", "", "tok", &past)
	// E2B's envd checks the signature first and says so when a genuine
	// one has expired; a forged one is only "invalid", expired or not.
	if r := do(t, "GET", fmt.Sprintf("%s&signature=%s&signature_expiration=%d", base, url.QueryEscape(psig), past), nil, nil); r.status != 401 ||
		string(r.body) != `{"code":401,"message":"signature is already expired"}`+"\n" {
		t.Errorf("expired signature: %d %s", r.status, r.body)
	}
	forged := Signature(file, "read", "", "other", &past)
	if r := do(t, "GET", fmt.Sprintf("%s&signature=%s&signature_expiration=%d", base, url.QueryEscape(forged), past), nil, nil); r.status != 401 ||
		!strings.Contains(string(r.body), `"invalid signature"`) {
		t.Errorf("forged expired signature: %d %s", r.status, r.body)
	}
}

func TestCompose(t *testing.T) {
	srv, _ := newServer(t, "")
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	os.WriteFile(a, []byte("hello "), 0o644)
	os.WriteFile(b, []byte("world"), 0o644)
	dst := filepath.Join(dir, "out", "c")
	body, _ := json.Marshal(composeRequest{SourcePaths: []string{a, b}, Destination: dst})
	r := do(t, "POST", srv.URL+"/files/compose", bytes.NewReader(body), map[string]string{"Content-Type": "application/json"})
	if r.status != 200 {
		t.Fatalf("compose: %d %s", r.status, r.body)
	}
	if got, _ := os.ReadFile(dst); string(got) != "hello world" {
		t.Errorf("content %q", got)
	}
	if _, err := os.Stat(a); !os.IsNotExist(err) {
		t.Error("source not removed")
	}
}

func TestLargeRoundTrip(t *testing.T) {
	srv, _ := newServer(t, "")
	data := make([]byte, 50<<20)
	rand.Read(data)
	dst := filepath.Join(t.TempDir(), "big.bin")
	body, ct := multipartBody(t, map[string][]byte{dst: data})
	if r := do(t, "POST", srv.URL+"/files", body, map[string]string{"Content-Type": ct}); r.status != 200 {
		t.Fatalf("upload: %d %s", r.status, r.body)
	}
	r := do(t, "GET", srv.URL+"/files?path="+url.QueryEscape(dst), nil, nil)
	if sha256.Sum256(r.body) != sha256.Sum256(data) {
		t.Errorf("round trip corrupted: %d bytes back", len(r.body))
	}
}

func benchServer(b *testing.B) (*httptest.Server, string) {
	srv := httptest.NewServer(NewHandler(openSettings()))
	b.Cleanup(srv.Close)
	return srv, filepath.Join(b.TempDir(), "bench.bin")
}

// benchData is 50 MiB of incompressible bytes.
func benchData() []byte {
	data := make([]byte, 50<<20)
	rand.Read(data)
	return data
}

// benchUpload posts body to /files b.N times; size is the file's size.
func benchUpload(b *testing.B, contentType string, body []byte, size int) {
	srv, dst := benchServer(b)
	b.SetBytes(int64(size))
	for i := 0; i < b.N; i++ {
		res, err := http.Post(srv.URL+"/files?path="+url.QueryEscape(dst), contentType, bytes.NewReader(body))
		if err != nil || res.StatusCode != 200 {
			b.Fatal(err, res)
		}
		res.Body.Close()
	}
}

// benchDownload reads a 50 MiB file b.N times with the given
// Accept-Encoding; decode turns the response body into the file's bytes.
func benchDownload(b *testing.B, acceptEncoding string, decode func(*http.Response) (io.Reader, error)) {
	srv, dst := benchServer(b)
	data := benchData()
	os.WriteFile(dst, data, 0o644)
	b.SetBytes(int64(len(data)))
	for i := 0; i < b.N; i++ {
		req, _ := http.NewRequest("GET", srv.URL+"/files?path="+url.QueryEscape(dst), nil)
		req.Header.Set("Accept-Encoding", acceptEncoding)
		res, err := http.DefaultClient.Do(req)
		if err != nil || res.StatusCode != 200 {
			b.Fatal(err, res)
		}
		r, err := decode(res)
		if err != nil {
			b.Fatal(err)
		}
		if n, _ := io.Copy(io.Discard, r); n != int64(len(data)) {
			b.Fatalf("%d bytes", n)
		}
		res.Body.Close()
	}
}

func BenchmarkUpload50MiB(b *testing.B) {
	data := benchData()
	benchUpload(b, "application/octet-stream", data, len(data))
}

func BenchmarkUploadMultipart50MiB(b *testing.B) {
	data := benchData()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	pw, _ := mw.CreateFormFile("file", "bench.bin")
	pw.Write(data)
	mw.Close()
	benchUpload(b, mw.FormDataContentType(), buf.Bytes(), len(data))
}

// BenchmarkDownload50MiB asks as undici does ("gzip, deflate"), which envd
// serves uncompressed; Go's transport alone would ask for exactly "gzip".
func BenchmarkDownload50MiB(b *testing.B) {
	benchDownload(b, "gzip, deflate", func(res *http.Response) (io.Reader, error) { return res.Body, nil })
}

// BenchmarkDownloadGzip50MiB measures the read({gzip: true}) path on
// incompressible data, gzip's worst case; see responseEncoding.
func BenchmarkDownloadGzip50MiB(b *testing.B) {
	benchDownload(b, "gzip", func(res *http.Response) (io.Reader, error) {
		if res.Header.Get("Content-Encoding") != "gzip" {
			return nil, fmt.Errorf("Content-Encoding %q, want gzip", res.Header.Get("Content-Encoding"))
		}
		return gzip.NewReader(res.Body)
	})
}

func TestComposeIntoASourceIsRejected(t *testing.T) {
	srv, _ := newServer(t, "")
	dir := t.TempDir()
	a := filepath.Join(dir, "a")
	os.WriteFile(a, []byte("keep"), 0o644)
	body, _ := json.Marshal(composeRequest{SourcePaths: []string{a}, Destination: a})
	r := do(t, "POST", srv.URL+"/files/compose", bytes.NewReader(body), map[string]string{"Content-Type": "application/json"})
	if r.status != 400 {
		t.Errorf("compose into its own source: %d %s", r.status, r.body)
	}
	if got, _ := os.ReadFile(a); string(got) != "keep" {
		t.Errorf("source changed to %q", got)
	}
}
