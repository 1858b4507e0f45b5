package api

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/template"
)

// A secret-looking detail an internal error must never carry to a client.
const leak = "open /var/lib/warren/warren.db: permission denied"

// check500 asserts the body of a 500 is exactly the opaque message naming
// the request ID the header carries, and that the log has the detail
// under that ID.
func check500(t *testing.T, hs *harness, what string, w interface {
	Result() *http.Response
}, body string) {
	t.Helper()
	res := w.Result()
	id := res.Header.Get(RequestIDHeader)
	if res.StatusCode != 500 {
		t.Fatalf("%s: status %d %s", what, res.StatusCode, body)
	}
	if !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(id) {
		t.Errorf("%s: request ID header %q", what, id)
	}
	want := fmt.Sprintf(`{"code":500,"message":"internal error (request %s)"}`, id)
	// E2B's error_code, where it names the cause, is all a 500 adds.
	switch what {
	case "manager error":
		want = fmt.Sprintf(`{"code":500,"error_code":"sandbox_create_failed","message":"Failed to place sandbox: sandbox creation failed, please retry; internal error (request %s)"}`, id)
	case "panic":
		want = fmt.Sprintf(`{"code":500,"error_code":"internal_server_error","message":"internal error (request %s)"}`, id)
	}
	if strings.TrimSpace(body) != want {
		t.Errorf("%s: body %s, want %s", what, body, want)
	}
	var line string
	for _, l := range strings.Split(hs.log.String(), "\n") {
		if strings.Contains(l, "request_id="+id) {
			line = l
		}
	}
	if !strings.Contains(line, "permission denied") {
		t.Errorf("%s: the log has no line with request_id=%s and the detail:\n%s", what, id, hs.log.String())
	}
}

func TestInternalErrorsAreNotEchoed(t *testing.T) {
	hs := newHarness(t, Config{})
	hs.sandboxes.create = func(sandbox.CreateRequest) (store.Sandbox, error) {
		return store.Sandbox{}, fmt.Errorf("sandbox: starting x: %s", leak)
	}
	w := hs.do("POST", "/sandboxes", keyTeam1, `{"templateID":"base"}`)
	check500(t, hs, "manager error", w, w.Body.String())

	hs.templates.err = errors.New(leak)
	w = hs.do("GET", "/templates", keyTeam1, "")
	check500(t, hs, "builder error", w, w.Body.String())

	hs.sandboxes.create = func(sandbox.CreateRequest) (store.Sandbox, error) { panic(leak) }
	w = hs.do("POST", "/sandboxes", keyTeam1, `{"templateID":"base"}`)
	check500(t, hs, "panic", w, w.Body.String())

	broken := newHarness(t, Config{Store: fakeStore{err: errors.New(leak)}})
	w = broken.do("GET", "/sandboxes", keyTeam1, "")
	check500(t, broken, "store error during authentication", w, w.Body.String())
}

func TestErrorsUsersNeedStay(t *testing.T) {
	hs := newHarness(t, Config{})
	for _, c := range []struct {
		err    error
		status int
	}{
		{fmt.Errorf("%w: timeout must not be negative", sandbox.ErrInvalid), 400},
		{fmt.Errorf("%w: \"nope\"", sandbox.ErrTemplateNotFound), 404},
		{fmt.Errorf("%w: sbx", sandbox.ErrConflict), 409},
		{fmt.Errorf("%w: the team has 3 sandboxes", sandbox.ErrTeamLimit), 429},
		{fmt.Errorf("%w: this node's memory is taken", sandbox.ErrNoCapacity), 503},
	} {
		hs.sandboxes.create = func(sandbox.CreateRequest) (store.Sandbox, error) { return store.Sandbox{}, c.err }
		w := hs.do("POST", "/sandboxes", keyTeam1, `{"templateID":"base"}`)
		code, msg := errorBody(t, w)
		want := c.err.Error()
		if c.status == 503 {
			want = placePrefix + want // E2B's prefix on a coded start failure
		}
		if code != c.status || msg != want {
			t.Errorf("%v: %d %q", c.err, code, msg)
		}
		if w.Header().Get(RequestIDHeader) == "" {
			t.Errorf("%v: no request ID header", c.err)
		}
	}
	hs.templates.err = fmt.Errorf("%w: build b1 was already started", template.ErrConflict)
	w := hs.do("POST", "/v2/templates/tpl1/builds/b1", keyTeam1, `{}`)
	if code, msg := errorBody(t, w); code != 409 || !strings.Contains(msg, "already started") {
		t.Errorf("builder conflict: %d %q", code, msg)
	}
}

func TestJSONBodiesAreCapped(t *testing.T) {
	hs := newHarness(t, Config{})
	big := `{"templateID":"base","metadata":{"k":"` + strings.Repeat("a", maxBody) + `"}}`
	w := hs.do("POST", "/sandboxes", keyTeam1, big)
	if code, _ := errorBody(t, w); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a body over 1 MiB: %d", code)
	}
	// Without a declared length (chunked), the cap holds while reading.
	req := strings.NewReader(big)
	r, _ := http.NewRequest("POST", "/v3/templates", struct{ *strings.Reader }{req})
	r.RemoteAddr = "192.0.2.1:1"
	r.Header.Set("X-API-Key", keyTeam1)
	w = newRecorder()
	hs.h.ServeHTTP(w, r)
	if code, _ := errorBody(t, w); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a chunked body over 1 MiB: %d", code)
	}
	if calls := hs.sandboxes.Calls(); len(calls) != 0 {
		t.Errorf("the manager was called: %v", calls)
	}
	// Just under the cap is fine.
	ok := `{"templateID":"base","metadata":{"k":"` + strings.Repeat("a", maxBody-100) + `"}}`
	if w := hs.do("POST", "/sandboxes", keyTeam1, ok); w.Code != http.StatusCreated {
		t.Errorf("a body under 1 MiB: %d %s", w.Code, w.Body.String())
	}
}

// An api process of a cluster has no template service yet: its template
// and snapshot routes answer 501 with an E2B body, and the rest serves.
func TestNoTemplateService(t *testing.T) {
	hs := newHarness(t, Config{})
	hs.h = New(Config{Store: fakeStore{}, Sandboxes: hs.sandboxes, Logger: slog.New(slog.NewTextHandler(hs.log, nil))})
	for _, r := range [][2]string{
		{"GET", "/templates"}, {"POST", "/v3/templates"}, {"GET", "/templates/base"}, {"DELETE", "/templates/base"},
		{"GET", "/snapshots"}, {"POST", "/sandboxes/sbx1/snapshots"},
	} {
		body := ""
		if r[0] == "POST" {
			body = `{"name":"x"}`
		}
		w := hs.do(r[0], r[1], keyTeam1, body)
		if code, msg := errorBody(t, w); code != http.StatusNotImplemented || !strings.Contains(msg, "--role api") {
			t.Errorf("%s %s: %d %q", r[0], r[1], code, msg)
		}
	}
	if w := hs.do("GET", "/v2/sandboxes", keyTeam1, ""); w.Code != http.StatusOK {
		t.Errorf("list sandboxes: %d", w.Code)
	}
}
