package secret

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/store"
)

func newService(t *testing.T) (*Service, store.Store, string) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.OpenSQLite(context.Background(), filepath.Join(dir, "warren.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	sealer, err := LoadSealer(dir)
	if err != nil {
		t.Fatal(err)
	}
	return New(st, sealer), st, dir
}

func TestSecretsAreSealedAndScoped(t *testing.T) {
	svc, st, dir := newService(t)
	ctx := context.Background()
	if fi, err := os.Stat(filepath.Join(dir, KeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("node key: %v %v", fi, err)
	}
	sec, err := svc.Create(ctx, "t1", "OpenAI-Key", "canary-value-1", map[string]string{"env": "prod"})
	if err != nil {
		t.Fatal(err)
	}
	if sec.Name != "openai-key" || !strings.HasPrefix(sec.ID, "sec_") || sec.CurrentVersion != 1 {
		t.Errorf("created %+v", sec)
	}
	if _, err := svc.Create(ctx, "t1", "openai-key", "x", nil); !errors.Is(err, ErrConflict) {
		t.Errorf("same name again: %v", err)
	}
	for _, bad := range []string{"", "sec_x", "a/b", "a b", strings.Repeat("a", 129)} {
		if _, err := svc.Create(ctx, "t1", bad, "x", nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("name %q: %v", bad, err)
		}
	}
	if _, err := svc.Create(ctx, "t1", "big", strings.Repeat("x", MaxValueBytes+1), nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("a value too large: %v", err)
	}
	// The database holds no clear value.
	_, sealed, err := st.SecretValue(ctx, "t1", "openai-key")
	if err != nil || strings.Contains(sealed, "canary") {
		t.Fatalf("sealed value %q, %v", sealed, err)
	}
	if v, err := svc.Resolve(ctx, "t1", "openai-key"); err != nil || v != "canary-value-1" {
		t.Errorf("resolve: %q, %v", v, err)
	}
	if _, err := svc.Resolve(ctx, "t2", "openai-key"); !errors.Is(err, ErrNotFound) {
		t.Errorf("another team resolves it: %v", err)
	}
	if _, err := svc.Get(ctx, "t2", sec.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("another team gets it: %v", err)
	}
	// A new version is current at once on this node (the cache is dropped).
	up, err := svc.Update(ctx, "t1", sec.ID, "canary-value-2", nil)
	if err != nil || up.CurrentVersion != 2 || up.Metadata["env"] != "prod" {
		t.Fatalf("update: %+v, %v", up, err)
	}
	if v, _ := svc.Resolve(ctx, "t1", "openai-key"); v != "canary-value-2" {
		t.Errorf("after the update: %q", v)
	}
	// A sealed value moved to another team's secret does not open.
	other, _ := svc.Create(ctx, "t2", "openai-key", "t2-value", nil)
	if _, err := svc.sealer.Open(sealed, versionContext("t2", other.ID, 1)); !errors.Is(err, ErrSealed) {
		t.Errorf("a value opened under another secret's context: %v", err)
	}
	// Another node key opens nothing.
	otherSealer, _ := LoadSealer(t.TempDir())
	if _, err := otherSealer.Open(sealed, versionContext("t1", sec.ID, 1)); !errors.Is(err, ErrSealed) {
		t.Errorf("another key: %v", err)
	}
	if err := svc.Delete(ctx, "t2", sec.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("another team deletes it: %v", err)
	}
	if err := svc.Delete(ctx, "t1", "OPENAI-KEY"); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Resolve(ctx, "t1", "openai-key"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a deleted secret resolves: %v", err)
	}
	for _, e := range []error{ErrInvalid, ErrNotFound, ErrConflict, ErrSealed} {
		if strings.Contains(e.Error(), "canary") {
			t.Error(e)
		}
	}
}

// Processes given the same cluster secret open each other's sealed
// values; another cluster secret, or the derived key's material used as
// a node key, does not; a short cluster secret is refused.
func TestSealerFromClusterSecret(t *testing.T) {
	clusterSecret := []byte(strings.Repeat("s", 32))
	api, err := SealerFromClusterSecret(clusterSecret)
	if err != nil {
		t.Fatal(err)
	}
	node, err := SealerFromClusterSecret(append([]byte(nil), clusterSecret...))
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := api.Seal("value", "t1/s1/1")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := node.Open(sealed, "t1/s1/1"); err != nil || got != "value" {
		t.Errorf("another process with the same cluster secret opened %q, %v", got, err)
	}
	other, err := SealerFromClusterSecret([]byte(strings.Repeat("t", 32)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Open(sealed, "t1/s1/1"); !errors.Is(err, ErrSealed) {
		t.Errorf("another cluster secret opened the value: %v", err)
	}
	if _, err := node.Open(sealed, "t2/s1/1"); !errors.Is(err, ErrSealed) {
		t.Errorf("the value opened in another context: %v", err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, KeyFile), clusterSecret, 0o600); err != nil {
		t.Fatal(err)
	}
	raw, err := LoadSealer(dir) // the secret itself as a key: not the derived key
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Open(sealed, "t1/s1/1"); !errors.Is(err, ErrSealed) {
		t.Errorf("the cluster secret used directly as the key opened the value: %v", err)
	}
	if _, err := SealerFromClusterSecret([]byte("short")); err == nil {
		t.Error("a 5-byte cluster secret was taken")
	}
}
