package files

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/envd/settings"
	"github.com/warren-sandbox/warren/internal/envd/users"
)

func TestParseFileQuery(t *testing.T) {
	q, err := parseFileQuery("path=%2Fa%2Fb&username=root&path=%2Fother&signature=v1_x&signature_expiration=17")
	if err != nil || q != (fileQuery{Path: "/a/b", Username: "root", Signature: "v1_x", Expiration: "17"}) {
		t.Errorf("got %+v %v", q, err)
	}
	for _, bad := range []string{"path=%zz", "path=a;b", "path=%"} {
		if _, err := parseFileQuery(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	srv, _ := newServer(t, "tok")
	if r := do(t, "GET", srv.URL+"/files?path=%zz", nil, map[string]string{"X-Access-Token": "tok"}); r.status != 400 || errorCode(t, r) != 400 {
		t.Errorf("malformed query: %d %s", r.status, r.body)
	}
}

// FuzzFileQuery: no /files query (or header set) panics the parser or the
// handler; a path it names resolves to an absolute, clean path; a
// signature holds for one operation only; and without the token nothing
// gets past authentication (so this target never touches the disk).
func FuzzFileQuery(f *testing.F) {
	exp := "4102444800" // 2100-01-01
	for _, s := range []string{
		"", "path=%2Fetc%2Fpasswd", "path=~/x&username=root", "path=../../etc/shadow&signature=v1_AAAA",
		"path=a&path=b&signature=" + Signature("a", "read", "", "tok", nil),
		"path=x&signature_expiration=" + exp + "&signature=v1_", "path=%00&username=%ff", "path=a;b", "path=%zz&x",
		"signature_expiration=-1&signature=v1_x", "signature_expiration=99999999999999999999",
	} {
		f.Add(s, "gzip", "key", "value")
	}
	h := NewHandler(settings.New("root", "", "tok"))
	u := &users.User{Name: "user", Home: "/home/user"}
	now := time.Unix(1700000000, 0)
	f.Fuzz(func(t *testing.T, raw, acceptEncoding, metaKey, metaValue string) {
		q, err := parseFileQuery(raw)
		if err == nil {
			if p := u.ResolvePath(q.Path, ""); !filepath.IsAbs(p) || filepath.Clean(p) != p {
				t.Fatalf("path %q resolved to %q", q.Path, p)
			}
			if q.Verify("read", "tok", now) == nil && q.Verify("write", "tok", now) == nil {
				t.Fatalf("%q: one signature for read and write", raw)
			}
			if q.Verify("read", "tok", now) == nil || q.Verify("write", "tok", now) == nil {
				return // a valid signature (a seed): the handler would touch the disk
			}
		}
		for _, target := range []struct{ method, path string }{{"GET", "/files"}, {"HEAD", "/files"}, {"POST", "/files"}, {"POST", "/files/compose"}} {
			req := httptest.NewRequest(target.method, "http://envd"+target.path, strings.NewReader(`{"source_paths":["/a"],"destination":"/b"}`))
			req.URL.RawQuery = raw
			req.Header.Set("Content-Type", "application/octet-stream")
			req.Header["Accept-Encoding"] = []string{acceptEncoding}
			req.Header["X-Metadata-"+metaKey] = []string{metaValue}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusUnauthorized && rec.Code != http.StatusBadRequest {
				t.Fatalf("%s %s?%s without the token: %d %s", target.method, target.path, raw, rec.Code, rec.Body)
			}
			var e struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if target.method != "HEAD" && (json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Code != rec.Code || e.Message == "") {
				t.Fatalf("%s %s?%s: body %q is not {code,message}", target.method, target.path, raw, rec.Body)
			}
		}
		meta, err := parseMetadata(http.Header{"X-Metadata-" + metaKey: {metaValue}})
		for k, v := range meta {
			if err != nil || k == "" || !printable(k) || !printable(v) {
				t.Fatalf("metadata %q=%q accepted (err %v)", k, v, err)
			}
		}
		_, _ = responseEncoding(&http.Request{Header: http.Header{"Accept-Encoding": {acceptEncoding}}})
	})
}
