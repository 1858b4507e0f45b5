package files

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
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
)

func TestResponseEncodingPolicy(t *testing.T) {
	for _, c := range []struct {
		accept, rangeHdr string
		gzip, ok         bool
	}{
		{"", "", false, true},
		{"gzip, deflate", "", false, true}, // undici's default: stay fast
		{"gzip, deflate, br, zstd", "", false, true},
		{"gzip", "", true, true}, // read({gzip: true})
		{"GZIP;q=1.0", "", true, true},
		{"x-gzip", "", true, true},
		{"gzip, identity;q=0.5", "", true, true},
		{"gzip;q=0", "", false, true},
		{"gzip", "bytes=0-1", false, true}, // ranges are served plainly
		{"identity;q=0", "", false, false},
		{"*;q=0", "", false, false},
		{"gzip;q=0, identity;q=0", "", false, false},
		{"br, identity;q=0", "", false, false},
		{"gzip, deflate, identity;q=0", "", true, true},
		{"gzip, identity;q=0", "bytes=0-1", true, true}, // identity refused beats Range
		{"*", "", false, true},
	} {
		r := httptest.NewRequest("GET", "/files", nil)
		if c.accept != "" {
			r.Header.Set("Accept-Encoding", c.accept)
		}
		if c.rangeHdr != "" {
			r.Header.Set("Range", c.rangeHdr)
		}
		if gz, ok := responseEncoding(r); gz != c.gzip || ok != c.ok {
			t.Errorf("%q range %q: gzip %v ok %v, want %v %v", c.accept, c.rangeHdr, gz, ok, c.gzip, c.ok)
		}
	}
}

func gunzip(t *testing.T, b []byte) string {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not gzip: %v", err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("bad gzip: %v", err)
	}
	return string(out)
}

func TestDownloadEncodingsAndConditions(t *testing.T) {
	srv, _ := newServer(t, "")
	file := filepath.Join(t.TempDir(), "c.txt")
	os.WriteFile(file, []byte("0123456789"), 0o644)
	u := srv.URL + "/files?path=" + url.QueryEscape(file)

	r := do(t, "GET", u, nil, map[string]string{"Accept-Encoding": "gzip", "Range": "bytes=1-2"})
	if r.status != 206 || string(r.body) != "12" || r.header.Get("Content-Encoding") != "" {
		t.Errorf("gzip+range: %d %q %v", r.status, r.body, r.header)
	}
	r = do(t, "GET", u, nil, map[string]string{"Accept-Encoding": "gzip, identity;q=0", "Range": "bytes=1-2"})
	if r.status != 200 || gunzip(t, r.body) != "0123456789" {
		t.Errorf("identity refused with range: %d", r.status)
	}
	lm := r.header.Get("Last-Modified")
	if lm == "" || r.header.Get("Vary") != "Accept-Encoding" || r.header.Get("Content-Type") != "application/octet-stream" {
		t.Errorf("gzip headers %v", r.header)
	}
	r = do(t, "GET", u, nil, map[string]string{"Accept-Encoding": "gzip", "If-Modified-Since": lm})
	if r.status != 304 {
		t.Errorf("conditional: %d", r.status)
	}
	r = do(t, "GET", u, nil, map[string]string{"Range": "bytes=20-"})
	if r.status != 416 {
		t.Errorf("unsatisfiable range: %d", r.status)
	}
	if cd := do(t, "GET", u, nil, nil).header.Get("Content-Disposition"); cd != `inline; filename=c.txt` && cd != `inline; filename="c.txt"` {
		t.Errorf("Content-Disposition %q", cd)
	}
	r = do(t, "HEAD", u, nil, nil)
	if r.status != 200 || r.header.Get("Content-Length") != "10" || len(r.body) != 0 {
		t.Errorf("HEAD: %d %v", r.status, r.header)
	}
	r = do(t, "PUT", u, nil, nil)
	if r.status != 405 || r.header.Get("Allow") == "" || r.header.Get("Content-Type") != "application/json" {
		t.Errorf("PUT: %d %v", r.status, r.header)
	}
}

// procfs files report size 0 but have content, and cannot seek to their
// end; they must still download.
func TestDownloadProcFile(t *testing.T) {
	srv, _ := newServer(t, "")
	want, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil || len(want) == 0 {
		t.Skip("no procfs")
	}
	r := do(t, "GET", srv.URL+"/files?path=/proc/version", nil, nil)
	if r.status != 200 || !strings.HasPrefix(string(r.body), "Linux") {
		t.Errorf("/proc/version: %d %q", r.status, r.body)
	}
	r = do(t, "GET", srv.URL+"/files?path=/proc/version", nil, map[string]string{"Accept-Encoding": "gzip"})
	if r.status != 200 || !strings.HasPrefix(gunzip(t, r.body), "Linux") {
		t.Errorf("/proc/version gzip: %d", r.status)
	}
}

// An unsized file longer than the first read is streamed in full.
func TestServeUnsizedStreams(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("0123456789abcdef"), 20000) // 320 KB
	go func() { pw.Write(data); pw.Close() }()
	rec := httptest.NewRecorder()
	serveUnsized(rec, httptest.NewRequest("GET", "/files", nil), pr, false)
	if rec.Code != 200 || !bytes.Equal(rec.Body.Bytes(), data) || rec.Header().Get("Content-Length") != "" {
		t.Errorf("status %d, %d bytes, header %v", rec.Code, rec.Body.Len(), rec.Header())
	}
}

func TestSpecialFilesAndBadPaths(t *testing.T) {
	srv, _ := newServer(t, "")
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan result, 1)
	go func() { done <- do(t, "GET", srv.URL+"/files?path="+url.QueryEscape(fifo), nil, nil) }()
	select {
	case r := <-done:
		if r.status != 400 {
			t.Errorf("FIFO download: %d %s", r.status, r.body)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("FIFO download hangs")
	}
	raw := map[string]string{"Content-Type": "application/octet-stream"}
	if r := do(t, "POST", srv.URL+"/files?path="+url.QueryEscape(fifo), strings.NewReader("x"), raw); r.status != 400 {
		t.Errorf("FIFO upload: %d %s", r.status, r.body)
	}
	if fi, err := os.Lstat(fifo); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Error("the FIFO was replaced")
	}
	nul := url.QueryEscape(filepath.Join(dir, "a\x00b"))
	if r := do(t, "POST", srv.URL+"/files?path="+nul, strings.NewReader("x"), raw); r.status != 400 {
		t.Errorf("NUL upload: %d %s", r.status, r.body)
	}
	if r := do(t, "GET", srv.URL+"/files?path="+nul, nil, nil); r.status != 400 {
		t.Errorf("NUL download: %d %s", r.status, r.body)
	}
	// compose refuses directories and FIFOs as sources, and touches nothing.
	for _, src := range []string{dir, fifo} {
		body, _ := json.Marshal(composeRequest{SourcePaths: []string{src}, Destination: filepath.Join(dir, "out")})
		if r := do(t, "POST", srv.URL+"/files/compose", bytes.NewReader(body), nil); r.status != 400 {
			t.Errorf("compose from %s: %d %s", src, r.status, r.body)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "out")); !os.IsNotExist(err) {
		t.Error("a failed compose wrote its destination")
	}
	if r := do(t, "PUT", srv.URL+"/files/compose", nil, nil); r.status != 405 || r.header.Get("Allow") != "POST" {
		t.Errorf("PUT compose: %d %v", r.status, r.header)
	}
}

// With ?path= every file part goes to that one path, so a second part is
// a duplicate (400), as in infra's envd.
func TestQueryPathWithTwoParts(t *testing.T) {
	srv, _ := newServer(t, "")
	dir := t.TempDir()
	body, ct := multipartBody(t, map[string][]byte{filepath.Join(dir, "x"): []byte("1"), filepath.Join(dir, "y"): []byte("2")})
	r := do(t, "POST", srv.URL+"/files?path="+url.QueryEscape(filepath.Join(dir, "q")), body, map[string]string{"Content-Type": ct})
	if r.status != 400 || !strings.Contains(string(r.body), "more than once") {
		t.Errorf("status %d %s", r.status, r.body)
	}
	for _, n := range []string{"x", "y"} {
		if _, err := os.Stat(filepath.Join(dir, n)); !os.IsNotExist(err) {
			t.Errorf("part filename %s was used despite ?path=", n)
		}
	}
}

func TestGzipMultipartAndMetadataReplacement(t *testing.T) {
	srv, _ := newServer(t, "")
	dir := t.TempDir()
	dst := filepath.Join(dir, "m", "z.txt")
	body, ct := multipartBody(t, map[string][]byte{dst: []byte("zipped form")})
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	io.Copy(zw, body)
	zw.Close()
	r := do(t, "POST", srv.URL+"/files", &gz, map[string]string{
		"Content-Type": ct, "Content-Encoding": "gzip", "X-Metadata-A": "1", "X-Metadata-": "dropped",
	})
	if r.status != 200 {
		t.Fatalf("gzip multipart: %d %s", r.status, r.body)
	}
	if b, _ := os.ReadFile(dst); string(b) != "zipped form" {
		t.Errorf("content %q", b)
	}
	var got []entry
	json.Unmarshal(r.body, &got)
	if len(got) != 1 || len(got[0].Metadata) != 1 || got[0].Metadata["a"] != "1" {
		t.Errorf("entries %+v", got)
	}
	// A second upload's metadata replaces the first's entirely.
	r = do(t, "POST", srv.URL+"/files?path="+url.QueryEscape(dst), strings.NewReader("v2"), map[string]string{
		"Content-Type": "application/octet-stream", "X-Metadata-B": "2",
	})
	if r.status != 200 {
		t.Fatalf("second upload: %d %s", r.status, r.body)
	}
	buf := make([]byte, 256)
	n, _ := unix.Listxattr(dst, buf)
	var names []string
	for _, s := range strings.Split(string(buf[:n]), "\x00") {
		if strings.HasPrefix(s, metadataXattrPrefix) {
			names = append(names, s)
		}
	}
	if len(names) != 1 || names[0] != "user.e2b.b" {
		t.Errorf("xattrs after replacement: %v", names)
	}
	// Metadata limits: the key may be 246 bytes; keys and values share 4096.
	ok := map[string]string{"Content-Type": "application/octet-stream", "X-Metadata-" + strings.Repeat("k", 246): "v"}
	if r := do(t, "POST", srv.URL+"/files?path="+url.QueryEscape(dst), strings.NewReader("x"), ok); r.status != 200 {
		t.Errorf("246-byte key: %d %s", r.status, r.body)
	}
	big := map[string]string{"Content-Type": "application/octet-stream", "X-Metadata-A": strings.Repeat("v", 3000), "X-Metadata-B": strings.Repeat("v", 1100)}
	if r := do(t, "POST", srv.URL+"/files?path="+url.QueryEscape(dst), strings.NewReader("x"), big); r.status != 400 {
		t.Errorf("4.1 KB of metadata: %d %s", r.status, r.body)
	}
}

// Files are written for the requesting user even over a file owned by
// someone else, and an existing file keeps its mode.
func TestOverwriteTakesOwnershipKeepsMode(t *testing.T) {
	srv, _ := newServer(t, "")
	dir := t.TempDir()
	dst := filepath.Join(dir, "script.sh")
	os.WriteFile(dst, []byte("old"), 0o750)
	r := do(t, "POST", srv.URL+"/files?username=nobody&path="+url.QueryEscape(dst), strings.NewReader("new"),
		map[string]string{"Content-Type": "application/octet-stream"})
	if r.status != 200 {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	fi, _ := os.Stat(dst)
	if fi.Mode().Perm() != 0o750 || fi.Sys().(*syscall.Stat_t).Uid != 65534 {
		t.Errorf("mode %v uid %d", fi.Mode().Perm(), fi.Sys().(*syscall.Stat_t).Uid)
	}
	if b, _ := os.ReadFile(dst); string(b) != "new" {
		t.Errorf("content %q", b)
	}
	// The response is JSON with the right Content-Type.
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	_ = http.StatusOK
}
