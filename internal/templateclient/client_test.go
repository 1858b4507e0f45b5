package templateclient

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/buildspec"
	"github.com/warren-sandbox/warren/internal/dockerfile"
)

const testKey = "e2b_testkey"

// fakeAPI plays the platform API for one template build.
type fakeAPI struct {
	t   *testing.T
	srv *httptest.Server

	mu        sync.Mutex
	calls     []string          // "METHOD path", in order
	created   map[string]any    // the POST /v3/templates body
	present   map[string]bool   // file hashes the server has
	uploads   map[string][]byte // hash → uploaded body
	spec      *buildspec.Spec   // the build start body
	offsets   []int             // logsOffset of each status poll
	statuses  []buildInfo       // what successive polls return (the last one repeats, minus entries)
	uploadErr int               // status for uploads, if not 0
	createErr int               // status for POST /v3/templates, if not 0
}

func newFakeAPI(t *testing.T) *fakeAPI {
	f := &fakeAPI{t: t, present: map[string]bool{}, uploads: map[string][]byte{}}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAPI) client() *Client {
	c := New(f.srv.URL+"/", testKey)
	c.PollInterval = time.Millisecond
	return c
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, r.Method+" "+r.URL.Path)
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")

	if parts[0] == "upload" { // the pre-signed upload URL
		if r.Header.Get("X-API-Key") != "" {
			f.t.Errorf("upload carries the API key")
		}
		if r.Header.Get("X-Upload-Token") != "tok" {
			f.t.Errorf("upload without the returned headers: %v", r.Header)
		}
		b, _ := io.ReadAll(r.Body)
		if r.ContentLength != int64(len(b)) || len(r.TransferEncoding) > 0 {
			f.t.Errorf("upload Content-Length %d (%v), body %d bytes", r.ContentLength, r.TransferEncoding, len(b))
		}
		if f.uploadErr != 0 {
			http.Error(w, "denied", f.uploadErr)
			return
		}
		f.uploads[parts[1]] = b
		f.present[parts[1]] = true
		w.WriteHeader(http.StatusOK)
		return
	}

	if r.Header.Get("X-API-Key") != testKey {
		writeJSON(w, 401, map[string]any{"code": 401, "message": "invalid API key"})
		return
	}
	switch {
	case r.Method == "POST" && r.URL.Path == "/v3/templates":
		if f.createErr != 0 {
			writeJSON(w, f.createErr, map[string]any{"code": f.createErr, "message": "no such luck"})
			return
		}
		json.NewDecoder(r.Body).Decode(&f.created)
		writeJSON(w, 202, map[string]any{"templateID": "tpl1", "buildID": "b1", "names": []string{"x"}, "tags": []string{}, "aliases": []string{}, "public": false})
	case r.Method == "GET" && len(parts) == 4 && parts[0] == "templates" && parts[1] == "tpl1" && parts[2] == "files":
		h := parts[3]
		writeJSON(w, 201, map[string]any{"present": f.present[h], "url": f.srv.URL + "/upload/" + h, "headers": map[string]string{"X-Upload-Token": "tok"}})
	case r.Method == "POST" && r.URL.Path == "/v2/templates/tpl1/builds/b1":
		if r.Header.Get("Content-Type") != "application/json" {
			f.t.Errorf("build start Content-Type %q", r.Header.Get("Content-Type"))
		}
		f.spec = &buildspec.Spec{}
		if err := json.NewDecoder(r.Body).Decode(f.spec); err != nil {
			f.t.Errorf("build start body: %v", err)
		}
		w.WriteHeader(202)
	case r.Method == "GET" && r.URL.Path == "/templates/tpl1/builds/b1/status":
		off, err := strconv.Atoi(r.URL.Query().Get("logsOffset"))
		if err != nil {
			f.t.Errorf("status poll without logsOffset: %q", r.URL.RawQuery)
		}
		f.offsets = append(f.offsets, off)
		var info buildInfo
		if len(f.statuses) > 0 {
			info = f.statuses[0]
			if len(f.statuses) > 1 {
				f.statuses = f.statuses[1:]
			} else {
				f.statuses[0].LogEntries = nil
			}
		}
		if info.LogEntries == nil {
			info.LogEntries = []logEntry{}
		}
		writeJSON(w, 200, info)
	default:
		writeJSON(w, 404, map[string]any{"code": 404, "message": "not found: " + r.Method + " " + r.URL.Path})
	}
}

// makeContext writes files (name → content; a name ending in "/" is a
// directory) under a new directory.
func makeContext(t *testing.T, files map[string]string) string {
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if strings.HasSuffix(name, "/") {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// untar lists a gzip'd tar's entries, with the content of files.
func untar(t *testing.T, b []byte) map[string]string {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("upload is not gzip: %v", err)
	}
	tr := tar.NewReader(zr)
	out := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("upload is not a tar: %v", err)
		}
		c, _ := io.ReadAll(tr)
		switch h.Typeflag {
		case tar.TypeSymlink:
			out[h.Name] = "-> " + h.Linkname
		default:
			out[h.Name] = string(c)
		}
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("entry %s owned by %d:%d", h.Name, h.Uid, h.Gid)
		}
	}
}

const testDockerfile = `FROM python:3.12
COPY . /app/
COPY --chmod=755 sub/x.txt /srv/
RUN pip install -r /app/requirements.txt
CMD ["python", "/app/app.py"]
`

func TestClientBuild(t *testing.T) {
	dir := makeContext(t, map[string]string{
		"app.py":              "print('hi')\n",
		"requirements.txt":    "flask\n",
		"sub/x.txt":           "x\n",
		"empty/":              "",
		"debug.log":           "noise",
		"node_modules/a/b.js": "js",
		".dockerignore":       "# comment\n*.log\nnode_modules\n",
	})
	if err := os.Symlink("app.py", filepath.Join(dir, "link.py")); err != nil {
		t.Fatal(err)
	}
	f := newFakeAPI(t)
	ts := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	f.statuses = []buildInfo{
		{Status: "waiting"},
		{Status: "building", LogEntries: []logEntry{{ts, "info", "pulling", "base"}, {ts, "info", "copying", "1"}}},
		{Status: "building", LogEntries: []logEntry{{ts, "warn", "slow", "3"}}},
		{Status: "ready", LogEntries: []logEntry{{ts, "info", "done", "finalize"}}},
		{Status: "ready"},
	}
	var events []Event
	res, err := f.client().Build(context.Background(), BuildOptions{
		Name: "my-app:v1", Dockerfile: testDockerfile, ContextDir: dir,
		CPUCount: 2, MemoryMB: 1024, Force: true,
		Progress: func(e Event) { events = append(events, e) },
	})
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	if want := (Result{TemplateID: "tpl1", BuildID: "b1", Status: "ready"}); res != want {
		t.Errorf("result %+v, want %+v", res, want)
	}

	if want := map[string]any{"name": "my-app:v1", "cpuCount": 2.0, "memoryMB": 1024.0}; !reflect.DeepEqual(f.created, want) {
		t.Errorf("create body %v, want %v", f.created, want)
	}

	// The spec sent is the parsed Dockerfile with the hashes filled in.
	want, err := dockerfile.Parse(testDockerfile)
	if err != nil {
		t.Fatal(err)
	}
	if f.spec == nil {
		t.Fatal("no build start")
	}
	if !f.spec.Force {
		t.Error("force not sent")
	}
	var hashes []string
	for i, s := range f.spec.Steps {
		if s.Type == "COPY" {
			if len(s.FilesHash) != 64 {
				t.Errorf("step %d: filesHash %q", i, s.FilesHash)
			}
			hashes = append(hashes, s.FilesHash)
			want.Steps[i].FilesHash = s.FilesHash
		}
	}
	want.Force = true
	if !reflect.DeepEqual(*f.spec, want) {
		t.Errorf("spec\n  %+v\nwant\n  %+v", *f.spec, want)
	}
	if len(hashes) != 2 || hashes[0] == hashes[1] {
		t.Fatalf("COPY hashes %v", hashes)
	}

	// Both COPY sources were uploaded, as archives of exactly their files.
	if got, want := untar(t, f.uploads[hashes[0]]), map[string]string{
		".dockerignore":    "# comment\n*.log\nnode_modules\n",
		"app.py":           "print('hi')\n",
		"empty/":           "",
		"link.py":          "-> app.py",
		"requirements.txt": "flask\n",
		"sub/":             "",
		"sub/x.txt":        "x\n",
	}; !reflect.DeepEqual(got, want) {
		t.Errorf("archive of .:\n  %v\nwant\n  %v", got, want)
	}
	if got, want := untar(t, f.uploads[hashes[1]]), map[string]string{"sub/x.txt": "x\n"}; !reflect.DeepEqual(got, want) {
		t.Errorf("archive of sub/x.txt: %v, want %v", got, want)
	}

	// The call sequence, and the log offsets.
	wantCalls := []string{
		"POST /v3/templates",
		"GET /templates/tpl1/files/" + hashes[0], "PUT /upload/" + hashes[0],
		"GET /templates/tpl1/files/" + hashes[1], "PUT /upload/" + hashes[1],
		"POST /v2/templates/tpl1/builds/b1",
	}
	for range 5 {
		wantCalls = append(wantCalls, "GET /templates/tpl1/builds/b1/status")
	}
	if !reflect.DeepEqual(f.calls, wantCalls) {
		t.Errorf("calls\n  %q\nwant\n  %q", f.calls, wantCalls)
	}
	if want := []int{0, 0, 2, 3, 4}; !reflect.DeepEqual(f.offsets, want) {
		t.Errorf("logsOffsets %v, want %v", f.offsets, want)
	}

	var got []string
	for _, e := range events {
		got = append(got, e.Status+"|"+e.Step+"|"+e.Level+"|"+e.Message)
	}
	wantEvents := []string{
		"waiting|||",
		"building|||",
		"building|base|info|pulling",
		"building|1|info|copying",
		"building|3|warn|slow",
		"ready|finalize|info|done",
		"ready|||",
	}
	if !reflect.DeepEqual(got, wantEvents) {
		t.Errorf("events\n  %q\nwant\n  %q", got, wantEvents)
	}
	if !events[2].Time.Equal(ts) {
		t.Errorf("log entry time %v", events[2].Time)
	}

	// A second build of the same context uploads nothing: the hashes are
	// the same and the server has the files.
	f.calls, f.offsets, f.uploads = nil, nil, map[string][]byte{}
	f.statuses = []buildInfo{{Status: "ready"}}
	if _, err := f.client().Build(context.Background(), BuildOptions{Name: "my-app:v1", Dockerfile: testDockerfile, ContextDir: dir}); err != nil {
		t.Fatalf("second Build: %v", err)
	}
	if len(f.uploads) != 0 {
		t.Errorf("second build uploaded %d archives", len(f.uploads))
	}
	if f.spec.Force {
		t.Error("force sent though not asked")
	}
	for i, s := range f.spec.Steps {
		if s.Type == "COPY" && s.FilesHash != hashes[0] && s.FilesHash != hashes[1] {
			t.Errorf("step %d: hash changed between runs", i)
		}
	}
}

func TestFilesHash(t *testing.T) {
	dir := makeContext(t, map[string]string{"a.txt": "one", "sub/b.txt": "two"})
	hash := func(src, dest string) string {
		t.Helper()
		bc, err := loadContext(dir)
		if err != nil {
			t.Fatal(err)
		}
		files, err := bc.match(src)
		if err != nil {
			t.Fatal(err)
		}
		h, err := filesHash(src, dest, files, dir)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	h0 := hash(".", "/app")
	if h := hash(".", "/app"); h != h0 {
		t.Errorf("hash not stable: %s, %s", h0, h)
	}
	if h := hash(".", "/other"); h == h0 {
		t.Error("hash ignores dest")
	}
	if err := os.WriteFile(filepath.Join(dir, "sub/b.txt"), []byte("TWO"), 0o644); err != nil {
		t.Fatal(err)
	}
	h1 := hash(".", "/app")
	if h1 == h0 {
		t.Error("hash ignores content")
	}
	if err := os.Chmod(filepath.Join(dir, "sub/b.txt"), 0o755); err != nil {
		t.Fatal(err)
	}
	h2 := hash(".", "/app")
	if h2 == h1 {
		t.Error("hash ignores mode")
	}
	if err := os.WriteFile(filepath.Join(dir, "new.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if h := hash(".", "/app"); h == h2 {
		t.Error("hash ignores a new file")
	}
	if h := hash("a.txt", "/app"); h == hash("sub", "/app") {
		t.Error("different sources, same hash")
	}
}

func TestMatch(t *testing.T) {
	dir := makeContext(t, map[string]string{
		"a.py": "", "b.py": "", "c.txt": "", "sub/d.py": "", "sub/deep/e.py": "", "sub/deep/f.txt": "",
		"skip/x.py": "", "keep.log": "", "other.log": "",
		".dockerignore": "skip/\n*.log\n!keep.log\n/sub/deep/*.txt\n",
	})
	bc, err := loadContext(dir)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		src  string
		want string
	}{
		{"*.py", "a.py b.py"},
		{"./a.py", "a.py"},
		{"sub", "sub sub/d.py sub/deep sub/deep/e.py"},
		{"sub/", "sub sub/d.py sub/deep sub/deep/e.py"},
		{"**/*.py", "a.py b.py sub/d.py sub/deep/e.py"},
		{"sub/**/*.py", "sub/d.py sub/deep/e.py"},
		{"*.log", "keep.log"},
		{".", ".dockerignore a.py b.py c.txt keep.log sub sub/d.py sub/deep sub/deep/e.py"},
	}
	for _, tt := range tests {
		files, err := bc.match(tt.src)
		if err != nil {
			t.Errorf("%s: %v", tt.src, err)
			continue
		}
		var got []string
		for _, f := range files {
			got = append(got, f.rel)
		}
		if strings.Join(got, " ") != tt.want {
			t.Errorf("%s: got %q, want %q", tt.src, strings.Join(got, " "), tt.want)
		}
	}
	for _, src := range []string{"nothing*", "skip/x.py", "../x", "/etc/passwd"} {
		if _, err := bc.match(src); err == nil {
			t.Errorf("%s: no error", src)
		}
	}
}

func TestClientBuildFailed(t *testing.T) {
	f := newFakeAPI(t)
	f.statuses = []buildInfo{
		{Status: "building", LogEntries: []logEntry{{time.Now(), "error", "exit status 1", "2"}}},
		{Status: "error", Reason: &struct {
			Message string `json:"message"`
			Step    string `json:"step"`
		}{"command failed: exit status 1", "2"}},
	}
	var last Event
	res, err := f.client().Build(context.Background(), BuildOptions{
		Name: "x", Dockerfile: "FROM alpine\nRUN false\n",
		Progress: func(e Event) { last = e },
	})
	var be *BuildError
	if !errors.As(err, &be) {
		t.Fatalf("error %v (%T), want a *BuildError", err, err)
	}
	if be.Step != "2" || be.Message != "command failed: exit status 1" || res.Status != "error" || be.BuildID != "b1" {
		t.Errorf("build error %+v, result %+v", be, res)
	}
	if !strings.Contains(err.Error(), "step 2") || !strings.Contains(err.Error(), "exit status 1") {
		t.Errorf("error message %q", err)
	}
	if last.Status != "error" || last.Message != be.Message || last.Step != "2" {
		t.Errorf("last event %+v", last)
	}
	// No COPY: no file calls.
	for _, c := range f.calls {
		if strings.Contains(c, "/files/") {
			t.Errorf("unexpected call %s", c)
		}
	}

	// An error without a reason.
	f.statuses = []buildInfo{{Status: "error"}}
	if _, err := f.client().Build(context.Background(), BuildOptions{Name: "x", Dockerfile: "FROM alpine\n"}); err == nil || !strings.Contains(err.Error(), "Unknown error") {
		t.Errorf("error %v", err)
	}
}

func TestClientErrors(t *testing.T) {
	dir := makeContext(t, map[string]string{"a.txt": "a"})
	copyDF := "FROM alpine\nCOPY a.txt /a.txt\n"

	t.Run("api error", func(t *testing.T) {
		f := newFakeAPI(t)
		f.createErr = 409
		_, err := f.client().Build(context.Background(), BuildOptions{Name: "x", Dockerfile: copyDF, ContextDir: dir})
		var ae *APIError
		if !errors.As(err, &ae) || ae.StatusCode != 409 || ae.Code != 409 || ae.Message != "no such luck" {
			t.Fatalf("error %v (%+v)", err, ae)
		}
		if !strings.Contains(err.Error(), "409") || !strings.Contains(err.Error(), "no such luck") {
			t.Errorf("message %q", err)
		}
	})
	t.Run("bad key", func(t *testing.T) {
		f := newFakeAPI(t)
		c := f.client()
		c.apiKey = "wrong"
		_, err := c.Build(context.Background(), BuildOptions{Name: "x", Dockerfile: copyDF, ContextDir: dir})
		var ae *APIError
		if !errors.As(err, &ae) || ae.StatusCode != 401 || ae.Message != "invalid API key" {
			t.Fatalf("error %v", err)
		}
	})
	t.Run("upload refused", func(t *testing.T) {
		f := newFakeAPI(t)
		f.uploadErr = 403
		_, err := f.client().Build(context.Background(), BuildOptions{Name: "x", Dockerfile: copyDF, ContextDir: dir})
		if err == nil || !strings.Contains(err.Error(), "403") {
			t.Fatalf("error %v", err)
		}
		if f.spec != nil {
			t.Error("build started after a failed upload")
		}
	})
	t.Run("missing source", func(t *testing.T) {
		f := newFakeAPI(t)
		_, err := f.client().Build(context.Background(), BuildOptions{Name: "x", Dockerfile: "FROM alpine\nCOPY nope.txt /x\n", ContextDir: dir})
		if err == nil || !strings.Contains(err.Error(), "nope.txt") {
			t.Fatalf("error %v", err)
		}
		if len(f.calls) != 0 {
			t.Errorf("calls made: %v", f.calls)
		}
	})
	t.Run("bad dockerfile", func(t *testing.T) {
		f := newFakeAPI(t)
		_, err := f.client().Build(context.Background(), BuildOptions{Name: "x", Dockerfile: "FROM alpine\nEXPOSE 80\n"})
		if err == nil || !strings.Contains(err.Error(), "EXPOSE on line 2") {
			t.Fatalf("error %v", err)
		}
		if len(f.calls) != 0 {
			t.Errorf("calls made: %v", f.calls)
		}
	})
	t.Run("cancelled while polling", func(t *testing.T) {
		f := newFakeAPI(t)
		f.statuses = []buildInfo{{Status: "building"}}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := f.client().Build(ctx, BuildOptions{Name: "x", Dockerfile: "FROM alpine\n"})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("error %v", err)
		}
	})
}
