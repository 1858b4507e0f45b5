package template

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/warren-sandbox/warren/internal/buildspec"
	"github.com/warren-sandbox/warren/internal/secret"
	"github.com/warren-sandbox/warren/internal/store"
)

// authRegistry serves a registry on loopback that wants basic auth with
// one of creds (user → password), and records the users it let in.
type authRegistry struct {
	host string
	mu   sync.Mutex
	seen []string
}

func startAuthRegistry(t *testing.T, creds map[string]string) *authRegistry {
	t.Helper()
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	open := httptest.NewServer(reg)
	t.Cleanup(open.Close)
	ar := &authRegistry{}
	authed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || creds[u] == "" || creds[u] != p {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		ar.mu.Lock()
		ar.seen = append(ar.seen, u)
		ar.mu.Unlock()
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(authed.Close)
	ar.host = strings.TrimPrefix(authed.URL, "http://")
	// One small image, pushed through the open door.
	var tarBuf bytes.Buffer
	tarBuf.Write(make([]byte, 1024)) // an empty tar: its end marker
	layer := static.NewLayer(tarBuf.Bytes(), types.DockerLayer)
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(strings.TrimPrefix(open.URL, "http://") + "/private/img:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	return ar
}

// TestRegistryCredentialsAreSealed: a build's registry password and
// service-account JSON reach the registry, but are never in the store in
// clear (neither its rows nor its files) nor in any answer or log line.
func TestRegistryCredentialsAreSealed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: unpacks an image's layer")
	}
	const password = "pw-Zq81-never-stored"
	const saJSON = `{"type":"service_account","private_key":"sa-Kx42-never-stored"}`
	reg := startAuthRegistry(t, map[string]string{"alice": password, "_json_key": saJSON})
	ctx := context.Background()
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "w.db")
	st, err := store.Open(ctx, dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	addTeam(t, st, "t1")
	sealer, err := secret.LoadSealer(dir)
	if err != nil {
		t.Fatal(err)
	}
	b := newUploadBuilder(t, st, filepath.Join(dir, "data"), func(c *Config) {
		c.InsecureRegistries = []string{reg.host}
		c.Sealer = sealer
	})
	defer b.Close()

	for name, auth := range map[string]*buildspec.RegistryAuth{
		"with-password": {Type: "registry", Username: "alice", Password: password},
		"with-gcp-key":  {Type: "gcp", ServiceAccountJSON: saJSON},
	} {
		c := newTemplate(t, b, "t1", name)
		spec := buildspec.Spec{FromImage: reg.host + "/private/img:1", FromImageRegistry: auth}
		if err := b.StartBuild(ctx, "t1", c.Template.ID, c.BuildID, spec); err != nil {
			t.Fatal(err)
		}
		e := &env{t: t, b: b, st: st}
		status := e.wait(c.Template.ID, c.BuildID)
		if status.Build.Status != store.BuildReady {
			t.Fatalf("%s: %s: %s\n%s", name, status.Build.Status, status.Build.ReasonMessage, e.messages(c.BuildID))
		}
		answers, _ := json.Marshal(status)
		info, _ := b.Get(ctx, "t1", c.Template.ID)
		more, _ := json.Marshal(info)
		answers = append(append(answers, more...), e.messages(c.BuildID)...)
		for _, s := range []string{password, "sa-Kx42-never-stored"} {
			if bytes.Contains(answers, []byte(s)) {
				t.Errorf("%s: an answer or the log carries a credential", name)
			}
		}
	}
	reg.mu.Lock()
	seen := strings.Join(reg.seen, ",")
	reg.mu.Unlock()
	if !strings.Contains(seen, "alice") || !strings.Contains(seen, "_json_key") {
		t.Errorf("the registry saw users %q: the pulls did not use the credentials", seen)
	}
	// Nothing in the database's files, WAL included, holds them.
	files, _ := filepath.Glob(dbPath + "*")
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{password, "sa-Kx42-never-stored"} {
			if bytes.Contains(raw, []byte(s)) {
				t.Errorf("%s holds a credential in clear", filepath.Base(f))
			}
		}
	}
}

// TestStartScrubsClearRegistryAuth: a build recorded before credentials
// were sealed loses them at the next start.
func TestStartScrubsClearRegistryAuth(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	b := newUploadBuilder(t, st, t.TempDir())
	c := newTemplate(t, b, "t1", "old")
	old := buildRecord{Tags: []string{DefaultTag}, Spec: &buildspec.Spec{FromImage: "example.com/x:1",
		FromImageRegistry: &buildspec.RegistryAuth{Type: "registry", Username: "bob", Password: "old-clear-pw"}}}
	if _, err := st.UpdateBuild(ctx, c.BuildID, func(x *store.Build) error {
		x.Status, x.Spec = store.BuildReady, old.String()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	bd, err := st.GetBuild(ctx, c.BuildID)
	if err != nil {
		t.Fatal(err)
	}
	rec := readRecord(bd)
	if strings.Contains(bd.Spec, "old-clear-pw") || strings.Contains(bd.Spec, "bob") || rec.Spec == nil ||
		rec.Spec.FromImage != "example.com/x:1" || rec.Spec.FromImageRegistry == nil || rec.Spec.FromImageRegistry.Type != "registry" {
		t.Errorf("after Start the build's spec is %s", bd.Spec)
	}
}
