package sandbox

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/blobstore"
	"github.com/warren-sandbox/warren/internal/store"
)

// Blobs no record names go once past the grace period; named ones and
// young ones stay.
func TestCollectBlobs(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "w.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	dir := t.TempDir()
	blobs, err := blobstore.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, team := range []string{"t1", "t2"} {
		if err := st.CreateTeam(ctx, store.Team{ID: team, Name: team, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	put := func(team, content string, age time.Duration) blobstore.Digest {
		d := blobstore.DigestOf([]byte(content))
		if err := blobs.Put(ctx, team, d, int64(len(content)), bytes.NewReader([]byte(content))); err != nil {
			t.Fatal(err)
		}
		old := time.Now().Add(-age)
		os.Chtimes(filepath.Join(dir, "teams", team, "sha256", d.Hex()), old, old)
		return d
	}
	named := put("t1", "named", 2*time.Hour)
	orphan := put("t1", "orphan", 2*time.Hour)
	young := put("t1", "young", time.Minute)
	// The same digest named by t1's record is an orphan in t2.
	otherTeams := put("t2", "named", 2*time.Hour)
	if err := st.CreateSandbox(ctx, store.Sandbox{ID: "sb1", TeamID: "t1", TemplateID: "base", State: store.StatePaused, PausedBlob: named.String()}); err != nil {
		t.Fatal(err)
	}
	n, err := CollectBlobs(ctx, st, blobs, time.Now().Add(-DefaultBlobGCGrace))
	if err != nil || n != 2 {
		t.Fatalf("collected %d: %v", n, err)
	}
	for d, want := range map[blobstore.Digest]bool{named: true, orphan: false, young: true} {
		_, err := blobs.Stat(ctx, "t1", d)
		if got := err == nil; got != want {
			t.Errorf("t1's %s kept %v, want %v (%v)", d, got, want, err)
		}
	}
	if _, err := blobs.Stat(ctx, "t2", otherTeams); !errors.Is(err, blobstore.ErrNotFound) {
		t.Errorf("t2's orphan kept: %v", err)
	}
}
