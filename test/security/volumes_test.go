package security

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Team volumes (issue 15): what a tenant can do with its volume's content
// API, its sandboxes' view of the volume, and other teams' volumes.

// volume is a team volume the suite made.
type volume struct {
	ID    string `json:"volumeID"`
	Name  string `json:"name"`
	Token string `json:"token"`
	team  team
}

// mustVolume creates a volume of tm, deleted when the test ends (call it
// before creating the sandboxes that mount it: cleanups run last first).
func mustVolume(t *testing.T, tm team, name string) volume {
	t.Helper()
	requireFlag(t, "volume-quota", "team volumes (issue 15)")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := S.srv.call(ctx, tm, "POST", "/volumes", map[string]string{"name": name})
	if err != nil || r.Status != http.StatusCreated {
		t.Fatalf("creating volume %s: %v %s", name, err, r)
	}
	var v volume
	if err := r.decode(&v); err != nil {
		t.Fatal(err)
	}
	v.team = tm
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		r, err := S.srv.call(ctx, tm, "DELETE", "/volumes/"+v.ID, nil)
		if err != nil || (r.Status != http.StatusNoContent && r.Status != http.StatusNotFound) {
			t.Errorf("deleting volume %s: %v %s", name, err, r)
		}
	})
	return v
}

// content sends a volume content request for volume id with token.
func content(t *testing.T, method, id, kind string, query url.Values, body io.Reader, token string) apiResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := S.srv.apiURL + "/volumecontent/" + id + "/" + kind
	if query != nil {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	r, err := do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	return r
}

func path(p string, more ...string) url.Values {
	q := url.Values{"path": {p}}
	for i := 0; i+1 < len(more); i += 2 {
		q.Set(more[i], more[i+1])
	}
	return q
}

// A sandbox plants links in its volume to host paths (absolute, relative
// past the root, through /proc's magic links, to a host directory, to
// "/"), then the content API is asked to read, write, chmod, list and
// delete through them. Every path resolves inside the volume: the host
// files and directory stay as they were, and no read returns their
// content.
func TestVolumeLinksPlantedInSandbox(t *testing.T) {
	afterCase(t)
	canary := S.canaries.plant(t, "vol-canary")
	canaryDir := S.canaries.plantDir(t, "vol-canary-dir")
	v := mustVolume(t, S.teamA, "sec-links")
	sb := mustCreate(t, S.teamA, createOpts{Volumes: map[string]string{"/data": v.Name}})
	sb.ok(t, "root", fmt.Sprintf(`cd /data && ln -s %[1]s abs && ln -s ../../../../../../../..%[1]s rel &&
		ln -s /proc/self/root%[1]s magic && ln -s /proc/1/cwd cwd && ln -s %[2]s dir && ln -s / root && ln -s . loop &&
		ln -s %[1]s abs2 && mkdir d && ln -s %[2]s d/out`, canary, canaryDir))
	// A hard link to a host file cannot even be made: the volume is its
	// own file system.
	if r := sb.run(t, "root", "ln /etc/passwd /data/hard"); r.Exit == 0 {
		t.Errorf("a hard link from the sandbox's root into the volume: %s", r)
	}
	for _, p := range []string{"/abs", "/rel", "/magic", "/cwd/etc/passwd", "/dir/x", "/root" + canary, "/loop/abs"} {
		r := content(t, "GET", v.ID, "file", path(p), nil, v.Token)
		if r.Status == http.StatusOK || bytes.Contains(r.Body, []byte("host canary")) {
			t.Errorf("reading %s: %s", p, r)
		}
		checkErrorBody(t, r)
	}
	for _, p := range []string{"/abs", "/rel", "/magic"} {
		if r := content(t, "PUT", v.ID, "file", path(p, "force", "true"), strings.NewReader("pwned\n"), v.Token); r.Status != http.StatusCreated {
			t.Errorf("writing over the link %s: %s, want 201 (the link replaced)", p, r)
		}
	}
	// Through a link to a host directory: the link's target is the
	// volume's own path of that name. While that does not exist the link
	// leads nowhere (404, even with force, which makes missing parents,
	// not links' targets); once made, writes land there.
	if r := content(t, "PUT", v.ID, "file", path("/dir/new", "force", "true"), strings.NewReader("pwned\n"), v.Token); r.Status != http.StatusNotFound {
		t.Errorf("writing through a link to a host directory: %s, want 404", r)
	}
	for _, p := range []string{"/root" + canaryDir + "/new2", "/dir/new", "/d/out/new3"} {
		if r := content(t, "PUT", v.ID, "file", path(p, "force", "true"), strings.NewReader("pwned\n"), v.Token); r.Status != http.StatusCreated {
			t.Errorf("writing through the link %s: %s", p, r)
		}
	}
	if r := content(t, "POST", v.ID, "dir", path("/d/out/sub", "force", "true"), nil, v.Token); r.Status != http.StatusCreated {
		t.Errorf("making a directory through a link: %s", r)
	}
	if out := sb.ok(t, "root", "ls /data"+canaryDir); out != "new\nnew2\nnew3\nsub\n" {
		t.Errorf("what was written through the links is not in the volume's %s: %q", canaryDir, out)
	}
	patch := strings.NewReader(`{"mode":511,"uid":1234}`)
	if r := content(t, "PATCH", v.ID, "path", path("/abs2"), patch, v.Token); r.Status != http.StatusNotFound {
		t.Errorf("chmod and chown through a link to a host file: %s, want 404", r)
	}
	r := content(t, "GET", v.ID, "dir", path("/", "depth", "10"), nil, v.Token)
	if r.Status != http.StatusOK || bytes.Count(r.Body, []byte(`"path"`)) > 20 {
		t.Errorf("listing with a link loop, depth 10: %s", r)
	}
	if r := content(t, "DELETE", v.ID, "path", path("/d"), nil, v.Token); r.Status != http.StatusNoContent {
		t.Errorf("deleting a directory holding a link to a host directory: %s", r)
	}
	if r := content(t, "DELETE", v.ID, "path", path("/dir"), nil, v.Token); r.Status != http.StatusNoContent {
		t.Errorf("deleting a link to a host directory: %s", r)
	}
}

// While the content API writes into a directory of the volume, the
// sandbox keeps swapping that directory for a link to a host directory.
// Each write lands inside the volume, or fails; none reaches the host.
func TestVolumeLinkSwapRace(t *testing.T) {
	afterCase(t)
	canaryDir := S.canaries.plantDir(t, "vol-race-dir")
	v := mustVolume(t, S.teamA, "sec-race")
	sb := mustCreate(t, S.teamA, createOpts{Volumes: map[string]string{"/data": v.Name}})
	sb.ok(t, "root", "mkdir /data/sw")
	done := make(chan result, 1)
	go func() {
		r, _ := sb.exec(context.Background(), "root", fmt.Sprintf(
			`timeout 10 sh -c 'while true; do mv /data/sw /data/sw.d && ln -s %s /data/sw && rm /data/sw && mv /data/sw.d /data/sw; done'; true`, canaryDir),
			time.Minute)
		done <- r
	}()
	deadline := time.Now().Add(8 * time.Second)
	writes, landed := 0, 0
	for i := 0; i < 400 && time.Now().Before(deadline); i++ {
		r := content(t, "PUT", v.ID, "file", path(fmt.Sprintf("/sw/f%d", i)), strings.NewReader("x"), v.Token)
		writes++
		if r.Status == http.StatusCreated {
			landed++
		}
	}
	<-done
	t.Logf("%d writes during the swaps, %d landed in the volume", writes, landed)
}

// A volume token opens its own volume only: not another volume (of its
// team or another's), and nothing opens a volume but its token (no API
// key, no access token, no prefix or case variant of the token).
func TestVolumeTokenScope(t *testing.T) {
	afterCase(t)
	va := mustVolume(t, S.teamA, "sec-tok-a")
	va2 := mustVolume(t, S.teamA, "sec-tok-a2")
	vb := mustVolume(t, S.teamB, "sec-tok-b")
	creds, err := S.srv.credentials()
	if err != nil {
		t.Fatal(err)
	}
	if r := content(t, "GET", va.ID, "dir", path("/"), nil, va.Token); r.Status != http.StatusOK {
		t.Fatalf("the right token: %s", r)
	}
	for name, c := range map[string]struct{ id, token string }{
		"team B's token on team A's volume": {va.ID, vb.Token},
		"team A's token on team B's volume": {vb.ID, va.Token},
		"another volume's token, same team": {va2.ID, va.Token},
		"no token":                          {va.ID, ""},
		"the team's API key":                {va.ID, S.teamA.key},
		"the team's access token":           {va.ID, creds["E2B_ACCESS_TOKEN"]},
		"a prefix of the token":             {va.ID, va.Token[:63]},
		"the token upper-cased":             {va.ID, strings.ToUpper(va.Token)},
		"a path segment for an ID":          {"..%2F" + va.ID, va.Token},
	} {
		r := content(t, "GET", c.id, "dir", path("/"), nil, c.token)
		if r.Status != http.StatusUnauthorized {
			t.Errorf("%s: %s, want 401", name, r)
		}
		checkErrorBody(t, r)
	}
	// The API key is no volume token, even in its own header.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", S.srv.apiURL+"/volumecontent/"+va.ID+"/dir?path=/", nil)
	req.Header.Set("X-API-Key", S.teamA.key)
	if r, err := do(req); err != nil || r.Status != http.StatusUnauthorized {
		t.Errorf("the API key in X-API-Key on the content API: %v %s", err, r)
	}
	// The control API is scoped by team.
	for _, m := range []string{"GET", "DELETE"} {
		r, err := S.srv.call(ctx, S.teamB, m, "/volumes/"+va.ID, nil)
		if err != nil || r.Status != http.StatusNotFound {
			t.Errorf("%s of team A's volume by team B: %v %s, want 404", m, err, r)
		}
	}
	r, err := S.srv.call(ctx, S.teamB, "GET", "/volumes", nil)
	if err != nil || bytes.Contains(r.Body, []byte(va.ID)) {
		t.Errorf("team B's list shows team A's volume: %v %s", err, r)
	}
	if r := content(t, "GET", va.ID, "dir", path("/"), nil, va.Token); r.Status != http.StatusOK {
		t.Errorf("team A's volume after team B's attempts: %s", r)
	}
}

// Volume names are per team: team B naming team A's volume in its
// sandbox's volumeMounts gets a 404 (or its own volume of that name),
// never team A's data.
func TestVolumeOfAnotherTeamByName(t *testing.T) {
	afterCase(t)
	va := mustVolume(t, S.teamA, "sec-shared-name")
	if r := content(t, "PUT", va.ID, "file", path("/secret"), strings.NewReader("team A's data\n"), va.Token); r.Status != http.StatusCreated {
		t.Fatalf("writing team A's secret: %s", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := S.createSandbox(ctx, S.teamB, createOpts{Volumes: map[string]string{"/data": va.Name}})
	se, ok := err.(*statusError)
	if !ok || se.r.Status != http.StatusNotFound {
		t.Fatalf("team B mounting team A's volume by name: %v, want 404", err)
	}
	checkErrorBody(t, se.r)
	vb := mustVolume(t, S.teamB, va.Name)
	if vb.ID == va.ID {
		t.Fatal("team B got team A's volume")
	}
	sb := mustCreate(t, S.teamB, createOpts{Volumes: map[string]string{"/data": va.Name}})
	if out := sb.ok(t, "root", "ls -A /data; cat /data/secret 2>/dev/null; true"); out != "" {
		t.Errorf("team B's sandbox sees %q in its volume of that name", out)
	}
}

// A volume's quota holds whatever the sandbox tries: plain writes,
// fallocate, a sparse file written into, hard links out of it; the
// node's disk loses no more than the quota, and other volumes stay
// writable. The content API gets 507 past it.
func TestVolumeQuotaBypass(t *testing.T) {
	afterCase(t)
	v := mustVolume(t, S.teamA, "sec-quota")
	other := mustVolume(t, S.teamA, "sec-quota-other")
	sb := mustCreate(t, S.teamA, createOpts{Volumes: map[string]string{"/data": v.Name, "/other": other.Name}})
	imgPath := filepath.Join(S.srv.dataDir, "volumes", v.ID, "disk.img")
	held := allocated(t, imgPath)
	free := S.srv.freeMB()
	for _, attack := range []string{
		"dd if=/dev/zero of=/data/dd bs=1M count=200",
		"fallocate -l 1G /data/fa",
		"truncate -s 100G /data/sparse && dd if=/dev/urandom of=/data/sparse bs=1M count=200 seek=50000 conv=notrunc",
		"for i in $(seq 40); do head -c 8M /dev/urandom > /data/many$i || exit 1; done",
	} {
		if r := sb.run(t, "root", attack); r.Exit == 0 {
			t.Errorf("%q wrote past the %d MB quota: %s", attack, volumeQuotaMB, r)
		}
		sb.ok(t, "root", "rm -f /data/dd /data/fa /data/sparse /data/many*")
	}
	if r := sb.run(t, "root", "echo x > /other/x && ln /other/x /data/hl"); r.Exit == 0 {
		t.Errorf("a hard link across volumes: %s", r)
	}
	// The volume's image held its blocks from its create on (issue 22):
	// the writes took nothing more of the node's disk, so they could
	// never reach its reserve.
	used := free - S.srv.freeMB()
	t.Logf("the volume's image holds %d MB of the node's disk; the sandbox's writes took %d MB more of it", held>>20, used)
	if used > volumeQuotaMB/3 {
		t.Errorf("the node's disk lost %d MB to writes into a volume of %d MB made before", used, volumeQuotaMB)
	}
	if now := allocated(t, imgPath); now > held {
		t.Errorf("the volume's image took %d MB more of the node's disk while the sandbox wrote (it held %d MB)", (now-held)>>20, held>>20)
	}
	sb.ok(t, "user", "head -c 10M /dev/zero > /other/fine")
	r := content(t, "PUT", v.ID, "file", path("/big"), io.LimitReader(zeroReader{}, 200<<20), v.Token)
	if r.Status != http.StatusInsufficientStorage {
		t.Errorf("writing 200 MB through the content API into a %d MB volume: %s, want 507", volumeQuotaMB, r)
	}
	checkErrorBody(t, r)
	if r := content(t, "GET", v.ID, "dir", path("/"), nil, v.Token); !bytes.Equal(bytes.TrimSpace(r.Body), []byte("[]")) {
		t.Errorf("after the refused write the volume holds %s", r)
	}
}

// allocated is how many bytes of the host's disk the file p holds.
func allocated(t *testing.T, p string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatalf("the volume's image: %v", err)
	}
	return st.Blocks * 512
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// Mount paths a sandbox must not have a volume at, and the one limit on
// how many volumes a team has.
func TestVolumeMountPathsAndLimits(t *testing.T) {
	afterCase(t)
	v := mustVolume(t, S.teamC, "sec-paths")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, p := range []string{"/", "relative", "/proc", "/proc/self", "/sys/fs/cgroup", "/dev", "/dev/shm",
		"/opt/warren", "/opt/warren/envd", "/opt", "/etc/resolv.conf", "/etc/hosts", "/etc", "/data/../proc", "/data/", "/a\x00b"} {
		_, err := S.createSandbox(ctx, S.teamC, createOpts{Volumes: map[string]string{p: v.Name}})
		if se, ok := err.(*statusError); !ok || se.r.Status != http.StatusBadRequest {
			t.Errorf("a volume at %q: %v, want 400", p, err)
		}
	}
	for i := 1; i < maxVolumesPerTeam; i++ {
		mustVolume(t, S.teamC, fmt.Sprintf("sec-limit-%d", i))
	}
	r, err := S.srv.call(ctx, S.teamC, "POST", "/volumes", map[string]string{"name": "sec-one-too-many"})
	if err != nil || r.Status != http.StatusTooManyRequests {
		t.Errorf("a volume past --max-volumes-per-team %d: %v %s, want 429", maxVolumesPerTeam, err, r)
	}
	// JSON bodies of the content API are capped like the API's.
	big := strings.NewReader(`{"mode":420,"pad":"` + strings.Repeat("x", 2<<20) + `"}`)
	if r := content(t, "PATCH", v.ID, "path", path("/"), big, v.Token); r.Status != http.StatusRequestEntityTooLarge {
		t.Errorf("a 2 MiB metadata update: %s, want 413", r)
	}
}
