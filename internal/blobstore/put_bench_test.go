package blobstore_test

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/warren-sandbox/warren/internal/blobstore"
)

// A file whose bytes are not the digest named is refused, and leaves no
// blob, in both stores (a file is read at offsets by an S3 upload).
func TestPutFileOfAnotherDigest(t *testing.T) {
	stores(t, func(t *testing.T, s blobstore.Store, _ func(string, blobstore.Digest, []byte)) {
		ctx := context.Background()
		data := make([]byte, 6<<20) // more than one part
		rand.Read(data)
		p := filepath.Join(t.TempDir(), "pack")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		wrong := blobstore.DigestOf(data[:len(data)-1])
		if err := s.Put(ctx, "team-a", wrong, int64(len(data)), f); !errors.Is(err, blobstore.ErrCorrupt) {
			t.Fatalf("Put of a file of another digest: %v", err)
		}
		if _, err := s.Stat(ctx, "team-a", wrong); !errors.Is(err, blobstore.ErrNotFound) {
			t.Fatalf("the refused Put left a blob: %v", err)
		}
	})
}

// BenchmarkS3PutFile: a 50 MiB pack file put into the S3 store (a new
// digest each time), as a pause does.
func BenchmarkS3PutFile(b *testing.B) {
	s, err := blobstore.NewS3(context.Background(), sharedS3(b).Config("bench"))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	data := make([]byte, 50<<20)
	rand.Read(data)
	p := filepath.Join(b.TempDir(), "pack")
	b.SetBytes(int64(len(data)))
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		data[0], data[1] = byte(i), byte(i>>8)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			b.Fatal(err)
		}
		d := blobstore.DigestOf(data)
		f, err := os.Open(p)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := s.Put(ctx, "bench", d, int64(len(data)), f); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		f.Close()
		s.Delete(ctx, "bench", d)
		b.StartTimer()
	}
}
