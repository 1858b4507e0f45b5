package blobstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/blobstore"
	"github.com/warren-sandbox/warren/internal/blobstore/s3test"
)

// shared is the package's S3 server, started by its first user.
var shared struct {
	once sync.Once
	dir  string
	srv  *s3test.Server
	err  error
}

func sharedS3(t testing.TB) *s3test.Server {
	shared.once.Do(func() {
		if shared.dir, shared.err = os.MkdirTemp("", "warren-blobstore-s3-"); shared.err == nil {
			shared.srv, shared.err = s3test.StartDir(shared.dir)
		}
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.srv
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.srv != nil {
		shared.srv.Stop()
	}
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

// stores runs f against a local store and one in a real S3 server.
func stores(t *testing.T, f func(t *testing.T, s blobstore.Store, corrupt func(team string, d blobstore.Digest, b []byte))) {
	t.Run("local", func(t *testing.T) {
		dir := t.TempDir()
		s, err := blobstore.NewLocal(dir)
		if err != nil {
			t.Fatal(err)
		}
		f(t, s, func(team string, d blobstore.Digest, b []byte) {
			p := filepath.Join(dir, "teams", team, "sha256", d.Hex())
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
		})
	})
	t.Run("s3", func(t *testing.T) {
		s, err := blobstore.NewS3(context.Background(), sharedS3(t).Config("cluster-a"))
		if err != nil {
			t.Fatal(err)
		}
		f(t, s, func(team string, d blobstore.Digest, b []byte) {
			if err := blobstore.OverwriteForTest(context.Background(), s, team, d, b); err != nil {
				t.Fatal(err)
			}
		})
	})
}

func TestStore(t *testing.T) {
	stores(t, func(t *testing.T, s blobstore.Store, corrupt func(string, blobstore.Digest, []byte)) {
		ctx := context.Background()
		tmp := t.TempDir()
		// 12 MiB: three parts of 5 MiB in the S3 store, sent concurrently.
		data := make([]byte, 12<<20+123)
		rand.Read(data)
		src := filepath.Join(tmp, "src")
		if err := os.WriteFile(src, data, 0o600); err != nil {
			t.Fatal(err)
		}
		d, size, err := blobstore.PutFile(ctx, s, "team-a", src)
		if err != nil || size != int64(len(data)) || d != blobstore.DigestOf(data) {
			t.Fatalf("PutFile: %v %d %v", d, size, err)
		}
		if info, err := s.Stat(ctx, "team-a", d); err != nil || info.Size != size {
			t.Fatalf("Stat: %+v %v", info, err)
		}
		got := filepath.Join(tmp, "got")
		if err := s.Get(ctx, "team-a", d, got); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(got); !bytes.Equal(b, data) {
			t.Fatal("Get: different bytes")
		}
		list, err := s.List(ctx, "team-a")
		if err != nil || len(list) != 1 || list[0].Digest != d {
			t.Fatalf("List: %+v %v", list, err)
		}

		// Another team finds nothing by the same digest; empty and
		// malformed teams fail closed.
		if err := s.Get(ctx, "team-b", d, filepath.Join(tmp, "b")); !errors.Is(err, blobstore.ErrNotFound) {
			t.Fatalf("Get of another team's digest: %v", err)
		}
		if l, err := s.List(ctx, "team-b"); err != nil || len(l) != 0 {
			t.Fatalf("List of team-b: %v %v", l, err)
		}
		for _, team := range []string{"", "..", "a/b", "team-a/../team-a"} {
			if _, err := s.Stat(ctx, team, d); !errors.Is(err, blobstore.ErrInvalid) {
				t.Errorf("Stat with team %q: %v", team, err)
			}
			if _, err := s.List(ctx, team); !errors.Is(err, blobstore.ErrInvalid) {
				t.Errorf("List with team %q: %v", team, err)
			}
		}

		// Bytes that are not their digest are not stored.
		small := []byte("hello")
		wrong := blobstore.DigestOf([]byte("other"))
		if err := s.Put(ctx, "team-a", wrong, int64(len(small)), bytes.NewReader(small)); !errors.Is(err, blobstore.ErrCorrupt) {
			t.Fatalf("Put with a wrong digest: %v", err)
		}
		if _, err := s.Stat(ctx, "team-a", wrong); !errors.Is(err, blobstore.ErrNotFound) {
			t.Fatalf("the wrong Put left a blob: %v", err)
		}

		// A corrupted blob, then a truncated one, is refused and leaves
		// nothing at the destination.
		for name, bad := range map[string][]byte{
			"corrupted": append(append([]byte{}, data[:100]...), append([]byte{data[100] ^ 1}, data[101:]...)...),
			"truncated": data[:len(data)/2],
		} {
			corrupt("team-a", d, bad)
			dst := filepath.Join(tmp, name)
			err := s.Get(ctx, "team-a", d, dst)
			if !errors.Is(err, blobstore.ErrCorrupt) {
				t.Fatalf("Get of a %s blob: %v", name, err)
			}
			t.Logf("%s: %v", name, err)
			if _, serr := os.Stat(dst); !os.IsNotExist(serr) {
				t.Fatalf("a refused Get left %s", dst)
			}
			left, _ := filepath.Glob(filepath.Join(tmp, "."+name+"*"))
			if len(left) != 0 {
				t.Fatalf("a refused Get left %v", left)
			}
		}

		if err := s.Delete(ctx, "team-a", d); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Stat(ctx, "team-a", d); !errors.Is(err, blobstore.ErrNotFound) {
			t.Fatalf("Stat after Delete: %v", err)
		}
		if err := s.Delete(ctx, "team-a", d); err != nil {
			t.Fatalf("Delete of a missing blob: %v", err)
		}
	})
}

// An upload a crash cut short leaves parts; AbortStale removes those
// begun before its time, and only those.
func TestS3AbortStale(t *testing.T) {
	ctx := context.Background()
	s, err := blobstore.NewS3(ctx, sharedS3(t).Config("abort"))
	if err != nil {
		t.Fatal(err)
	}
	if err := blobstore.StartUploadForTest(ctx, s, "team-a"); err != nil {
		t.Fatal(err)
	}
	if n, err := s.AbortStale(ctx, time.Now().Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("AbortStale of an upload younger than the grace: %d %v", n, err)
	}
	if n, err := s.AbortStale(ctx, time.Now().Add(time.Minute)); err != nil || n != 1 {
		t.Fatalf("AbortStale: %d %v", n, err)
	}
	if n, err := s.AbortStale(ctx, time.Now().Add(time.Minute)); err != nil || n != 0 {
		t.Fatalf("AbortStale again: %d %v", n, err)
	}
}
