package api

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/volume"
)

// fakeVolumes keeps volumes in memory, each tree a directory of the test.
type fakeVolumes struct {
	t     testing.TB
	mu    sync.Mutex
	vols  map[string]store.Volume
	dirs  map[string]string
	inUse map[string][]string // volume ID → sandboxes mounting it
	limit int
}

func newFakeVolumes(t testing.TB) *fakeVolumes {
	return &fakeVolumes{t: t, vols: map[string]store.Volume{}, dirs: map[string]string{}, inUse: map[string][]string{}}
}

func (f *fakeVolumes) Create(_ context.Context, teamID, name string) (store.Volume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if name == "" || strings.ContainsAny(name, " /.") {
		return store.Volume{}, fmt.Errorf("%w: bad name", volume.ErrInvalid)
	}
	n := 0
	for _, v := range f.vols {
		if v.TeamID == teamID {
			n++
			if v.Name == name {
				return store.Volume{}, fmt.Errorf("%w: taken", volume.ErrConflict)
			}
		}
	}
	if f.limit > 0 && n >= f.limit {
		return store.Volume{}, volume.ErrTeamLimit
	}
	id := fmt.Sprintf("00000000-0000-4000-8000-%012d", len(f.vols)+1)
	v := store.Volume{ID: id, TeamID: teamID, Name: name, Token: strings.Repeat(fmt.Sprint(len(f.vols)+1), 64)[:64]}
	f.vols[id] = v
	dir := filepath.Join(f.t.TempDir(), "data")
	if err := os.Mkdir(dir, 0o777); err != nil {
		f.t.Fatal(err)
	}
	f.dirs[id] = dir
	return v, nil
}

func (f *fakeVolumes) Get(_ context.Context, teamID, id string) (store.Volume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.vols[id]
	if !ok || v.TeamID != teamID {
		return store.Volume{}, volume.ErrNotFound
	}
	return v, nil
}

func (f *fakeVolumes) List(_ context.Context, teamID string) ([]store.Volume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []store.Volume
	for _, v := range f.vols {
		if v.TeamID == teamID {
			out = append(out, v)
		}
	}
	return out, nil
}

func (f *fakeVolumes) Delete(ctx context.Context, teamID, id string) error {
	if _, err := f.Get(ctx, teamID, id); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if users := f.inUse[id]; len(users) > 0 {
		return &store.VolumeInUseError{VolumeID: id, SandboxIDs: users}
	}
	delete(f.vols, id)
	return nil
}

func (f *fakeVolumes) Authenticate(_ context.Context, id, token string) (store.Volume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.vols[id]
	if !ok || subtle.ConstantTimeCompare([]byte(v.Token), []byte(token)) != 1 {
		return store.Volume{}, volume.ErrUnauthorized
	}
	return v, nil
}

func (f *fakeVolumes) Tree(v store.Volume) (*volume.Tree, error) {
	f.mu.Lock()
	dir := f.dirs[v.ID]
	f.mu.Unlock()
	return volume.OpenTree(dir)
}

func volumeHarness(t testing.TB, cfg Config) (*harness, *fakeVolumes) {
	vols := newFakeVolumes(t)
	cfg.Volumes = vols
	return newHarness(t, cfg), vols
}

func TestVolumeControlEndpoints(t *testing.T) {
	free := int64(10000)
	hs, vols := volumeHarness(t, Config{DiskReserveMB: 100, FreeDiskMB: func() (int64, error) { return free, nil }})
	vols.limit = 2
	w := hs.do("POST", "/volumes", keyTeam1, `{"name":"data"}`)
	if w.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	var v struct{ VolumeID, Name, Token string }
	json.Unmarshal(w.Body.Bytes(), &v)
	if v.Name != "data" || v.VolumeID == "" || v.Token == "" {
		t.Errorf("created %s", w.Body)
	}
	// In order: the third volume is over the team's limit of two only once "other" exists.
	for _, c := range []struct {
		body string
		want int
	}{
		{`{"name":"data"}`, http.StatusConflict},
		{`{"name":"a b"}`, http.StatusBadRequest},
		{`{}`, http.StatusBadRequest},
		{`{"name":`, http.StatusBadRequest},
		{`{"name":"other"}`, http.StatusCreated},
		{`{"name":"third"}`, http.StatusTooManyRequests},
	} {
		if w := hs.do("POST", "/volumes", keyTeam1, c.body); w.Code != c.want {
			t.Errorf("create %s: %d %s, want %d", c.body, w.Code, w.Body, c.want)
		} else if c.want >= 400 {
			errorBody(t, w)
		}
	}
	free = 50
	if w := hs.do("POST", "/volumes", keyTeam2, `{"name":"x"}`); w.Code != http.StatusInsufficientStorage {
		t.Errorf("create below the disk reserve: %d", w.Code)
	}
	if w := hs.do("GET", "/volumes/"+v.VolumeID, keyTeam1, ""); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), v.Token) {
		t.Errorf("get: %d %s", w.Code, w.Body)
	}
	for _, m := range []string{"GET", "DELETE"} {
		if w := hs.do(m, "/volumes/"+v.VolumeID, keyTeam2, ""); w.Code != http.StatusNotFound {
			t.Errorf("%s by another team: %d", m, w.Code)
		}
	}
	if w := hs.do("GET", "/volumes", keyTeam2, ""); w.Code != http.StatusOK || strings.TrimSpace(w.Body.String()) != "[]" {
		t.Errorf("another team's list: %d %s", w.Code, w.Body)
	}
	if w := hs.do("GET", "/volumes", "", ""); w.Code != http.StatusUnauthorized {
		t.Errorf("list without a key: %d", w.Code)
	}
	vols.inUse[v.VolumeID] = []string{"sbxa", "sbxb"}
	w = hs.do("DELETE", "/volumes/"+v.VolumeID, keyTeam1, "")
	if _, msg := errorBody(t, w); w.Code != http.StatusConflict || !strings.Contains(msg, "sbxa, sbxb") {
		t.Errorf("delete while mounted: %d %q", w.Code, msg)
	}
	delete(vols.inUse, v.VolumeID)
	if w := hs.do("DELETE", "/volumes/"+v.VolumeID, keyTeam1, ""); w.Code != http.StatusNoContent {
		t.Errorf("delete: %d %s", w.Code, w.Body)
	}
	if w := hs.do("DELETE", "/volumes/"+v.VolumeID, keyTeam1, ""); w.Code != http.StatusNotFound {
		t.Errorf("second delete: %d", w.Code)
	}
}

func TestVolumeContentAuthentication(t *testing.T) {
	hs, vols := volumeHarness(t, Config{})
	a, _ := vols.Create(context.Background(), "t1", "a")
	b, _ := vols.Create(context.Background(), "t2", "b")
	list := func(id, token string, hdr ...string) int {
		if token != "" {
			hdr = append(hdr, "Authorization", "Bearer "+token)
		}
		w := hs.doFrom("192.0.2.9:1", "GET", "/volumecontent/"+id+"/dir?path=/", "", "", hdr...)
		if w.Code >= 400 {
			errorBody(t, w)
		}
		return w.Code
	}
	if code := list(a.ID, a.Token); code != http.StatusOK {
		t.Fatalf("the right token: %d", code)
	}
	for name, code := range map[string]int{
		"another team's token": list(a.ID, b.Token),
		"on another volume":    list(b.ID, a.Token),
		"no token":             list(a.ID, ""),
		"an API key":           list(a.ID, "", "X-API-Key", keyTeam1),
		"an unknown volume":    list("00000000-0000-4000-8000-999999999999", a.Token),
	} {
		if code != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", name, code)
		}
	}
	// Failures spend the address's budget: guessing tokens gets 429.
	var last int
	for i := 0; i < authFailureBurst+5; i++ {
		last = list(a.ID, "guess")
	}
	if last != http.StatusTooManyRequests {
		t.Errorf("after %d wrong tokens: %d, want 429", authFailureBurst+5, last)
	}
}

func TestVolumeContentThroughTheAPI(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: content requests set owners (9090 by default)")
	}
	hs, vols := volumeHarness(t, Config{})
	v, _ := vols.Create(context.Background(), "t1", "a")
	auth := []string{"Authorization", "Bearer " + v.Token}
	req := func(method, kind string, q url.Values, body string) *httpResponse {
		w := hs.do(method, "/volumecontent/"+v.ID+"/"+kind+"?"+q.Encode(), "", body, auth...)
		return &httpResponse{w.Code, w.Body.Bytes()}
	}
	big := strings.Repeat("0123456789abcdef", 3<<16) // 3 MiB: over the JSON cap
	if r := req("PUT", "file", url.Values{"path": {"/dir/f.bin"}, "force": {"true"}, "mode": {"416"}}, big); r.code != http.StatusCreated ||
		!bytes.Contains(r.body, []byte(`"size":3145728`)) || !bytes.Contains(r.body, []byte(`"mode":416`)) {
		t.Fatalf("PUT: %d %s", r.code, r.body)
	}
	if r := req("GET", "file", url.Values{"path": {"dir/f.bin"}}, ""); r.code != http.StatusOK || string(r.body) != big {
		t.Errorf("GET: %d, %d bytes", r.code, len(r.body))
	}
	if r := req("GET", "dir", url.Values{"path": {"/"}, "depth": {"2"}}, ""); r.code != http.StatusOK ||
		!bytes.Contains(r.body, []byte(`"path":"/dir/f.bin"`)) {
		t.Errorf("list: %d %s", r.code, r.body)
	}
	if r := req("PATCH", "path", url.Values{"path": {"/dir/f.bin"}}, `{"mode":384}`); r.code != http.StatusOK || !bytes.Contains(r.body, []byte(`"mode":384`)) {
		t.Errorf("PATCH: %d %s", r.code, r.body)
	}
	for _, c := range []struct {
		method, kind string
		q            url.Values
		want         int
	}{
		{"GET", "file", url.Values{"path": {"../../etc/passwd"}}, 400},
		{"GET", "file", url.Values{"path": {"/dir"}}, 400},
		{"GET", "file", url.Values{"path": {"/none"}}, 404},
		{"GET", "dir", url.Values{"path": {"/"}, "depth": {"11"}}, 400},
		{"GET", "dir", url.Values{"path": {"/"}, "depth": {"-1"}}, 400},
		{"GET", "file", url.Values{}, 400},
		{"POST", "dir", url.Values{"path": {"/dir"}}, 409},
		{"POST", "dir", url.Values{"path": {"/x"}, "mode": {"2541"}}, 400}, // 0o4755: setuid
		{"POST", "dir", url.Values{"path": {"/x"}, "uid": {"4294967295"}}, 400},
		{"POST", "dir", url.Values{"path": {"/x"}, "uid": {"4294967296"}}, 400},
		{"DELETE", "path", url.Values{"path": {"/"}}, 400},
		{"DELETE", "path", url.Values{"path": {"/dir"}}, 204},
		{"GET", "path", url.Values{"path": {"/dir/f.bin"}}, 404},
	} {
		r := req(c.method, c.kind, c.q, "")
		if r.code != c.want {
			t.Errorf("%s %s?%s: %d %s, want %d", c.method, c.kind, c.q.Encode(), r.code, r.body, c.want)
		}
	}
}

type httpResponse struct {
	code int
	body []byte
}

// FuzzVolumeContentPath sends any path (and depth) through the content
// API's read, list, stat, mkdir and delete handlers, on a volume beside a
// host directory: the answer is a success or a well-formed client error,
// and nothing outside the volume changes.
func FuzzVolumeContentPath(f *testing.F) {
	for _, s := range []string{"/", "a", "../x", "/a/../../b", "a\x00", "//..//", "/.../x", "%2e%2e/x", "/link/x", "/" + strings.Repeat("a/", 300)} {
		f.Add(s, uint8(1))
	}
	hs, vols := volumeHarness(f, Config{})
	v, _ := vols.Create(context.Background(), "t1", "a")
	outside := f.TempDir()
	victim := filepath.Join(outside, "victim")
	os.WriteFile(victim, []byte("victim"), 0o644)
	os.Symlink(outside, filepath.Join(vols.dirs[v.ID], "link"))
	own := fmt.Sprint(os.Getuid())
	auth := []string{"Authorization", "Bearer " + v.Token}
	f.Fuzz(func(t *testing.T, p string, depth uint8) {
		for _, c := range []struct{ method, kind string }{
			{"GET", "file"}, {"GET", "path"}, {"GET", "dir"}, {"POST", "dir"}, {"DELETE", "path"},
		} {
			q := url.Values{"path": {p}, "depth": {fmt.Sprint(depth)}, "uid": {own}, "gid": {own}, "force": {"true"}}
			w := hs.do(c.method, "/volumecontent/"+v.ID+"/"+c.kind+"?"+q.Encode(), "", "", auth...)
			checkAnswer(t, hs, c.method+" "+c.kind+" "+p, w.Code, w.Body.Bytes())
		}
		if b, err := os.ReadFile(victim); err != nil || string(b) != "victim" {
			t.Fatalf("the victim outside changed: %q %v", b, err)
		}
		if es, _ := os.ReadDir(outside); len(es) != 1 {
			t.Fatalf("outside now holds %d entries", len(es))
		}
	})
}
