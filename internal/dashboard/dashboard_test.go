package dashboard

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/store"
)

const goodKey = "e2b_0123456789abcdef0123456789abcdef01234567"

// fakeAPI answers as the platform API does about credentials: only
// goodKey in X-API-Key, and only sandbox "sb1" of its team. It records
// the last request's headers.
type fakeAPI struct {
	last http.Header
	// lastContent is the last volume content request: method, path?query and body.
	lastContent string
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.last = r.Header.Clone()
	if strings.HasPrefix(r.URL.Path, "/volumecontent/") {
		body, _ := io.ReadAll(r.Body)
		f.lastContent = r.Method + " " + r.URL.RequestURI() + " " + string(body)
		// The content API takes only the volume's own token.
		if r.Header.Get("Authorization") != "Bearer vol-token" || !strings.HasPrefix(r.URL.Path, "/volumecontent/vol1/") {
			writeError(w, http.StatusUnauthorized, "missing or invalid volume token")
			return
		}
		writeJSONBody(w, http.StatusOK, []any{})
		return
	}
	if r.Header.Get("X-API-Key") != goodKey {
		writeError(w, http.StatusUnauthorized, "invalid API key or access token")
		return
	}
	switch r.URL.Path {
	case "/sandboxes":
		writeJSONBody(w, http.StatusOK, []any{})
	case "/sandboxes/sb1":
		writeJSONBody(w, http.StatusOK, map[string]any{"sandboxID": "sb1", "envdAccessToken": "envd-token"})
	case "/volumes/vol1":
		writeJSONBody(w, http.StatusOK, map[string]any{"volumeID": "vol1", "name": "v", "token": "vol-token"})
	default:
		writeError(w, http.StatusNotFound, "sandbox not found")
	}
}

// fakeEnvd stands in for a sandbox (through the proxy) that tries to act
// as the dashboard's origin.
type fakeEnvd struct{ last *http.Request }

func (f *fakeEnvd) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.last = r
	w.Header().Set("Set-Cookie", "warren_session=stolen; Path=/")
	w.Header().Set("Content-Type", "text/html")
	w.Header().Set("Access-Control-Allow-Origin", "*")
	io.WriteString(w, "<script>alert(1)</script>")
}

func newTest(t *testing.T) (*Handler, *fakeAPI, *fakeEnvd, *time.Time) {
	t.Helper()
	now := time.Unix(1_000_000, 0)
	api, envd := &fakeAPI{}, &fakeEnvd{}
	return New(Config{API: api, Envd: envd, Now: func() time.Time { return now }}), api, envd, &now
}

func do(h http.Handler, method, path, body string, hdr map[string]string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, "http://warren.test"+path, strings.NewReader(body))
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func signIn(t *testing.T, h http.Handler) string {
	t.Helper()
	w := do(h, "POST", "/dashboard/session", `{"key":"`+goodKey+`"}`, map[string]string{Header: "1", "Origin": "http://warren.test"})
	if w.Code != http.StatusOK {
		t.Fatalf("sign-in: %d %s", w.Code, w.Body)
	}
	c := w.Result().Cookies()
	if len(c) != 1 || (c[0].Name != CookieName && c[0].Name != AdminCookieName) {
		t.Fatalf("sign-in set cookies %v", c)
	}
	if !c[0].HttpOnly || c[0].SameSite != http.SameSiteStrictMode || c[0].Path != Prefix || c[0].Secure {
		t.Errorf("cookie %+v: want httpOnly, SameSite=Strict, Path=%s, not Secure over plain HTTP", c[0], Prefix)
	}
	if strings.Contains(w.Body.String(), goodKey) {
		t.Errorf("sign-in answer shows the key: %s", w.Body)
	}
	return c[0].Name + "=" + c[0].Value
}

func TestSignInRefusesWrongKeyWithAPIMessage(t *testing.T) {
	h, _, _, _ := newTest(t)
	w := do(h, "POST", "/dashboard/session", `{"key":"e2b_nope"}`, map[string]string{Header: "1"})
	if w.Code != http.StatusUnauthorized || !strings.Contains(w.Body.String(), "invalid API key") || len(w.Result().Cookies()) != 0 {
		t.Fatalf("wrong key: %d %s cookies %v", w.Code, w.Body, w.Result().Cookies())
	}
}

func TestCookieOnlyOnDashboardAPI(t *testing.T) {
	h, api, _, _ := newTest(t)
	cookie := signIn(t, h)
	// The plain API gets the cookie untouched, and no credential from it.
	do(h, "GET", "/sandboxes", "", map[string]string{"Cookie": cookie})
	if api.last.Get("X-API-Key") != "" {
		t.Fatal("the plain API was given the session's key")
	}
	// Through the dashboard's door: the session's key, no cookie, and the
	// browser's own credentials dropped.
	w := do(h, "GET", "/dashboard/api/sandboxes", "", map[string]string{"Cookie": cookie, Header: "1", "Authorization": "Bearer sk_e2b_other"})
	if w.Code != http.StatusOK || api.last.Get("X-API-Key") != goodKey || api.last.Get("Cookie") != "" || api.last.Get("Authorization") != "" {
		t.Fatalf("dashboard API call: %d, API saw %v", w.Code, api.last)
	}
}

func TestCSRF(t *testing.T) {
	h, _, _, _ := newTest(t)
	cookie := signIn(t, h)
	for name, hdr := range map[string]map[string]string{
		"no header":      {"Cookie": cookie},
		"foreign origin": {"Cookie": cookie, Header: "1", "Origin": "http://evil.test"},
		"cross-site":     {"Cookie": cookie, Header: "1", "Sec-Fetch-Site": "cross-site"},
		"other scheme":   {"Cookie": cookie, Header: "1", "Origin": "https://warren.test"},
	} {
		for _, path := range []string{"/dashboard/api/sandboxes/sb1", "/dashboard/envd/sb1/files", "/dashboard/session"} {
			if w := do(h, "DELETE", path, "", hdr); w.Code != http.StatusForbidden {
				t.Errorf("%s: DELETE %s = %d, want 403", name, path, w.Code)
			}
		}
	}
	// A preflight is never granted.
	w := do(h, "OPTIONS", "/dashboard/api/sandboxes", "", map[string]string{"Origin": "http://evil.test", "Access-Control-Request-Method": "DELETE"})
	if w.Header().Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("preflight granted: %v", w.Header())
	}
}

func TestSessionsFailClosed(t *testing.T) {
	h, _, _, now := newTest(t)
	for _, c := range []string{"", CookieName + "=", CookieName + "=unknown"} {
		w := do(h, "GET", "/dashboard/api/sandboxes", "", map[string]string{"Cookie": c, Header: "1"})
		if w.Code != http.StatusUnauthorized || w.Header().Get(SessionHeader) != "none" {
			t.Errorf("cookie %q: %d", c, w.Code)
		}
	}
	cookie := signIn(t, h)
	*now = now.Add(SessionTTL)
	if w := do(h, "GET", "/dashboard/api/sandboxes", "", map[string]string{"Cookie": cookie, Header: "1"}); w.Code != http.StatusUnauthorized {
		t.Errorf("expired session: %d", w.Code)
	}
	cookie = signIn(t, h)
	if w := do(h, "DELETE", "/dashboard/session", "", map[string]string{"Cookie": cookie, Header: "1"}); w.Code != http.StatusNoContent {
		t.Fatalf("sign out: %d", w.Code)
	}
	if w := do(h, "GET", "/dashboard/api/sandboxes", "", map[string]string{"Cookie": cookie, Header: "1"}); w.Code != http.StatusUnauthorized {
		t.Errorf("signed-out session: %d", w.Code)
	}
}

func TestEnvdDoor(t *testing.T) {
	h, _, envd, _ := newTest(t)
	cookie := signIn(t, h)
	hdr := map[string]string{"Cookie": cookie, Header: "1", "X-Access-Token": "forged", "Authorization": "Basic dXNlcjo="}
	// Another team's (or no) sandbox: the API's 404, and envd never reached.
	if w := do(h, "GET", "/dashboard/envd/sb2/files?path=/x", "", hdr); w.Code != http.StatusNotFound || envd.last != nil {
		t.Fatalf("other sandbox: %d, envd reached: %v", w.Code, envd.last != nil)
	}
	if w := do(h, "GET", "/dashboard/envd/SB1%2F..%2F/files", "", hdr); w.Code != http.StatusBadRequest {
		t.Errorf("bad ID: %d", w.Code)
	}
	w := do(h, "GET", "/dashboard/envd/sb1/files?path=/x", "", hdr)
	r := envd.last
	if r == nil || r.URL.Path != "/files" || r.URL.Query().Get("path") != "/x" || r.Header.Get("E2b-Sandbox-Id") != "sb1" ||
		r.Header.Get("E2b-Sandbox-Port") != "49983" || r.Header.Get("X-Access-Token") != "envd-token" || r.Header.Get("Cookie") != "" ||
		r.Header.Get("Authorization") != "Basic dXNlcjo=" {
		t.Fatalf("envd got %v %v", r.URL, r.Header)
	}
	// What the sandbox answers cannot act as the dashboard.
	if c := w.Header().Values("Set-Cookie"); len(c) != 0 {
		t.Errorf("a sandbox set a cookie: %v", c)
	}
	if w.Header().Get("Content-Disposition") != "attachment" || w.Header().Get("X-Content-Type-Options") != "nosniff" ||
		!strings.HasPrefix(w.Header().Get("Content-Security-Policy"), "sandbox") || w.Header().Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("envd answer headers %v", w.Header())
	}
	// A bearer token in the browser's Authorization is not passed on.
	hdr["Authorization"] = "Bearer sk_e2b_x"
	do(h, "GET", "/dashboard/envd/sb1/files", "", hdr)
	if envd.last.Header.Get("Authorization") != "" {
		t.Errorf("a bearer credential reached the sandbox")
	}
}

func TestPagesAndRedirect(t *testing.T) {
	h, api, _, _ := newTest(t)
	w := do(h, "GET", "/", "", map[string]string{"Accept": "text/html"})
	if w.Code != http.StatusFound || w.Header().Get("Location") != Prefix {
		t.Errorf("GET / from a browser: %d %v", w.Code, w.Header())
	}
	// An SDK's GET / is the API's.
	api.last = nil
	do(h, "GET", "/", "", map[string]string{"X-API-Key": goodKey, "Accept": "text/html"})
	if api.last == nil {
		t.Error("an SDK's GET / did not reach the API")
	}
	for _, p := range []string{"/dashboard/", "/dashboard/app.js", "/dashboard/vendor/xterm.mjs", "/dashboard/vendor/uPlot.iife.min.js"} {
		w := do(h, "GET", p, "", nil)
		if w.Code != http.StatusOK || w.Header().Get("Content-Security-Policy") == "" {
			t.Errorf("GET %s: %d %v", p, w.Code, w.Header())
		}
	}
	// Gzipped to a browser that takes it, the same bytes once unzipped.
	plain := do(h, "GET", "/dashboard/vendor/xterm.mjs", "", nil)
	zipped := do(h, "GET", "/dashboard/vendor/xterm.mjs", "", map[string]string{"Accept-Encoding": "gzip, br"})
	zr, err := gzip.NewReader(zipped.Body)
	if err != nil || zipped.Header().Get("Content-Encoding") != "gzip" || !strings.HasPrefix(zipped.Header().Get("Content-Type"), "text/javascript") {
		t.Fatalf("gzipped: %v %v", err, zipped.Header())
	}
	unzipped, _ := io.ReadAll(zr)
	if !bytes.Equal(unzipped, plain.Body.Bytes()) || zipped.Body.Len() >= plain.Body.Len()/2 {
		t.Errorf("gzipped %d bytes, unzipped %d, plain %d", zipped.Body.Len(), len(unzipped), plain.Body.Len())
	}
	if w := do(h, "GET", "/dashboard/", "", map[string]string{"Accept-Encoding": "gzip"}); w.Code != 200 || w.Header().Get("Content-Encoding") != "gzip" {
		t.Errorf("index gzipped: %d %v", w.Code, w.Header())
	}
	if w := do(h, "GET", "/dashboard/../internal", "", nil); w.Code == http.StatusOK {
		t.Errorf("path escape served: %d", w.Code)
	}
	var body map[string]any
	w = do(h, "GET", "/dashboard/session", "", map[string]string{Header: "1"})
	if json.Unmarshal(w.Body.Bytes(), &body); w.Code != http.StatusUnauthorized || body["message"] == nil {
		t.Errorf("session without cookie: %d %s", w.Code, w.Body)
	}
}

// TestSessionsBoundedPerTeam: one team signing in over and over ends its
// own oldest sessions, never fills the server's table for other teams.
func TestSessionsBoundedPerTeam(t *testing.T) {
	h, _, _, now := newTest(t)
	first := signIn(t, h)
	for i := 0; i < MaxSessionsPerTeam; i++ {
		*now = now.Add(time.Second)
		signIn(t, h)
	}
	h.mu.Lock()
	n := len(h.sessions)
	h.mu.Unlock()
	if n != MaxSessionsPerTeam {
		t.Errorf("%d sessions kept, want %d", n, MaxSessionsPerTeam)
	}
	if w := do(h, "GET", "/dashboard/api/sandboxes", "", map[string]string{"Cookie": first, Header: "1"}); w.Code != http.StatusUnauthorized {
		t.Errorf("the team's oldest session still works: %d", w.Code)
	}
}

// TestTossedCookieRefused: a page of a sibling host (a sandbox's, under
// the same domain) can set a second warren_session cookie for the
// dashboard's path, to sign the user into the attacker's session. Two
// session cookies are refused rather than either one used.
func TestTossedCookieRefused(t *testing.T) {
	h, _, _, _ := newTest(t)
	mine := signIn(t, h)
	theirs := signIn(t, h)
	for _, c := range []string{theirs + "; " + mine, mine + "; " + theirs} {
		if w := do(h, "GET", "/dashboard/api/sandboxes", "", map[string]string{"Cookie": c, Header: "1"}); w.Code != http.StatusUnauthorized {
			t.Errorf("two session cookies %q: %d", c, w.Code)
		}
	}
}

func TestVolumeContentDoor(t *testing.T) {
	h, api, _, _ := newTest(t)
	cookie := signIn(t, h)
	hdr := map[string]string{"Cookie": cookie, Header: "1", "Authorization": "Bearer forged"}
	// The team's volume: its token put in by the server, the session's key
	// and the browser's credential not passed on.
	w := do(h, "GET", "/dashboard/api/volumecontent/vol1/dir?path=/", "", hdr)
	if w.Code != http.StatusOK || api.last.Get("Authorization") != "Bearer vol-token" || api.last.Get("X-API-Key") != "" {
		t.Fatalf("own volume: %d %s, API saw %v", w.Code, w.Body, api.last)
	}
	if w.Header().Get("Content-Disposition") != "attachment" || !strings.HasPrefix(w.Header().Get("Content-Security-Policy"), "sandbox") {
		t.Errorf("a volume's content served without the hostile headers: %v", w.Header())
	}
	if strings.Contains(w.Body.String(), "vol-token") {
		t.Errorf("the volume's token reached the page: %s", w.Body)
	}
	// Another team's (or no) volume: the API's 404 from the lookup.
	if w := do(h, "GET", "/dashboard/api/volumecontent/vol2/dir?path=/", "", hdr); w.Code != http.StatusNotFound {
		t.Errorf("other volume: %d %s", w.Code, w.Body)
	}
	// Without a session: refused before any lookup.
	if w := do(h, "GET", "/dashboard/api/volumecontent/vol1/dir", "", map[string]string{Header: "1"}); w.Code != http.StatusUnauthorized {
		t.Errorf("no session: %d", w.Code)
	}
}

const adminToken = "wadm_00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

// fakeNodes is a store's nodes.
type fakeNodes struct{ nodes []store.Node }

func (f *fakeNodes) ListNodes(context.Context) ([]store.Node, error) { return f.nodes, nil }

func (f *fakeNodes) SetNodeState(_ context.Context, name string, st store.NodeState) error {
	for i := range f.nodes {
		if f.nodes[i].Name == name {
			f.nodes[i].State = st
			return nil
		}
	}
	return store.ErrNotFound
}

func TestAdminDoor(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	nodes := &fakeNodes{nodes: []store.Node{{Name: "local", State: store.NodeReady, CPUs: 8, MemoryMB: 16384, HeartbeatAt: now}}}
	api := &fakeAPI{}
	h := New(Config{API: api, Now: func() time.Time { return now }, Admin: &AdminConfig{Token: adminToken, Nodes: nodes}})
	team := signIn(t, h)
	// A team's session neither sees nor acts on nodes.
	for _, c := range []struct{ method, path string }{{"GET", "/dashboard/admin/nodes"}, {"POST", "/dashboard/admin/nodes/local/cordon"}} {
		if w := do(h, c.method, c.path, "", map[string]string{"Cookie": team, Header: "1"}); w.Code != http.StatusForbidden {
			t.Errorf("team session: %s %s = %d, want 403", c.method, c.path, w.Code)
		}
	}
	if nodes.nodes[0].State != store.NodeReady {
		t.Fatalf("a team's session changed the node: %v", nodes.nodes[0].State)
	}
	// No session: 401.
	if w := do(h, "GET", "/dashboard/admin/nodes", "", map[string]string{Header: "1"}); w.Code != http.StatusUnauthorized {
		t.Errorf("no session: %d", w.Code)
	}
	// The admin token signs in without the API, and reaches only the admin door.
	api.last = nil
	w := do(h, "POST", "/dashboard/session", `{"key":"`+adminToken+`"}`, map[string]string{Header: "1"})
	if w.Code != http.StatusOK || api.last != nil || !strings.Contains(w.Body.String(), `"admin":true`) {
		t.Fatalf("admin sign-in: %d %s (API reached: %v)", w.Code, w.Body, api.last != nil)
	}
	c := w.Result().Cookies()[0]
	if c.Name != AdminCookieName {
		t.Errorf("the admin listener's cookie is %q, want %q", c.Name, AdminCookieName)
	}
	admin := c.Name + "=" + c.Value
	hdr := map[string]string{"Cookie": admin, Header: "1"}
	w = do(h, "GET", "/dashboard/admin/nodes", "", hdr)
	var list []nodeJSON
	if err := json.Unmarshal(w.Body.Bytes(), &list); w.Code != http.StatusOK || err != nil || len(list) != 1 || list[0].Name != "local" || list[0].State != "ready" || list[0].CPUs != 8 {
		t.Fatalf("admin list: %d %s", w.Code, w.Body)
	}
	if w := do(h, "POST", "/dashboard/admin/nodes/local/cordon", "", hdr); w.Code != http.StatusOK || nodes.nodes[0].State != store.NodeCordoned {
		t.Errorf("cordon: %d %s, state %v", w.Code, w.Body, nodes.nodes[0].State)
	}
	if w := do(h, "POST", "/dashboard/admin/nodes/nosuch/drain", "", hdr); w.Code != http.StatusNotFound {
		t.Errorf("unknown node: %d", w.Code)
	}
	if w := do(h, "POST", "/dashboard/admin/nodes/local/explode", "", hdr); w.Code != http.StatusNotFound {
		t.Errorf("unknown action: %d", w.Code)
	}
	// CSRF applies: without the header, refused.
	if w := do(h, "POST", "/dashboard/admin/nodes/local/uncordon", "", map[string]string{"Cookie": admin}); w.Code != http.StatusForbidden {
		t.Errorf("admin call without the CSRF header: %d", w.Code)
	}
	api.last = nil
	for _, p := range []string{"/dashboard/api/sandboxes", "/dashboard/envd/sb1/files"} {
		if w := do(h, "GET", p, "", hdr); w.Code != http.StatusForbidden {
			t.Errorf("admin session on %s: %d, want 403", p, w.Code)
		}
	}
	if api.last != nil {
		t.Errorf("the admin token reached the API: %v", api.last)
	}
}

func TestNoAdminDoorWithoutAdminConfig(t *testing.T) {
	h, _, _, _ := newTest(t)
	// The admin token is no credential here: the API refuses it.
	if w := do(h, "POST", "/dashboard/session", `{"key":"`+adminToken+`"}`, map[string]string{Header: "1"}); w.Code != http.StatusUnauthorized {
		t.Errorf("admin token on a public dashboard: %d", w.Code)
	}
	cookie := signIn(t, h)
	if w := do(h, "GET", "/dashboard/admin/nodes", "", map[string]string{"Cookie": cookie, Header: "1"}); w.Code != http.StatusNotFound {
		t.Errorf("admin door on a public dashboard: %d, want 404", w.Code)
	}
}

// TestVolumeContentDoorWrites: an upload (PUT) and a delete pass the
// volume door with the same checks as a read: CSRF header and own origin,
// a session, the team's volume; the volume's token is the server's.
func TestVolumeContentDoorWrites(t *testing.T) {
	h, api, _, _ := newTest(t)
	cookie := signIn(t, h)
	hdr := map[string]string{"Cookie": cookie, Header: "1", "Origin": "http://warren.test"}
	w := do(h, "PUT", "/dashboard/api/volumecontent/vol1/file?path=%2Fdocs%2Fa.txt&force=true", "file bytes", hdr)
	if w.Code != http.StatusOK || api.lastContent != "PUT /volumecontent/vol1/file?path=%2Fdocs%2Fa.txt&force=true file bytes" || api.last.Get("Authorization") != "Bearer vol-token" {
		t.Fatalf("upload: %d %s, API saw %q %v", w.Code, w.Body, api.lastContent, api.last)
	}
	w = do(h, "DELETE", "/dashboard/api/volumecontent/vol1/path?path=%2Fdocs%2Fa.txt", "", hdr)
	if w.Code != http.StatusOK || api.lastContent != "DELETE /volumecontent/vol1/path?path=%2Fdocs%2Fa.txt " {
		t.Fatalf("delete: %d %s, API saw %q", w.Code, w.Body, api.lastContent)
	}
	api.lastContent = ""
	refused := []struct {
		name string
		hdr  map[string]string
		path string
		want int
	}{
		{"no CSRF header", map[string]string{"Cookie": cookie}, "/dashboard/api/volumecontent/vol1/file?path=/b", http.StatusForbidden},
		{"another origin", map[string]string{"Cookie": cookie, Header: "1", "Origin": "https://evil.example"}, "/dashboard/api/volumecontent/vol1/file?path=/b", http.StatusForbidden},
		{"no session", map[string]string{Header: "1"}, "/dashboard/api/volumecontent/vol1/file?path=/b", http.StatusUnauthorized},
		{"another team's volume", hdr, "/dashboard/api/volumecontent/vol2/file?path=/b", http.StatusNotFound},
	}
	for _, c := range refused {
		for _, m := range []string{"PUT", "DELETE"} {
			if w := do(h, m, c.path, "x", c.hdr); w.Code != c.want {
				t.Errorf("%s %s: %d, want %d", m, c.name, w.Code, c.want)
			}
		}
	}
	if api.lastContent != "" {
		t.Errorf("a refused write reached the content API: %q", api.lastContent)
	}
}
