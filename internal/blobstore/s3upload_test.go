package blobstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/warren-sandbox/warren/internal/blobstore"
)

// An upload cut short after some parts is resumed by the next Put of the
// same blob: the parts stored are not sent again, a stored part whose
// bytes are not the file's is, and the blob comes back whole.
func TestS3UploadResumes(t *testing.T) {
	cfg := sharedS3(t).Config("resume")
	cfg.PartSize, cfg.Concurrency = 5<<20, 1
	s, err := blobstore.NewS3(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	const team, part = "team-r", 5 << 20
	data := make([]byte, 6*part+12345) // 7 parts
	rand.Read(data)
	p := filepath.Join(t.TempDir(), "pack")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	d := blobstore.DigestOf(data)
	put := func(ctx context.Context) ([]blobstore.Progress, error) {
		var seen []blobstore.Progress
		ctx = blobstore.WithProgress(ctx, func(pr blobstore.Progress) { seen = append(seen, pr) })
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		return seen, s.Put(ctx, team, d, int64(len(data)), f)
	}

	// Cut short after three parts, as a crash would.
	ctx, cancel := context.WithCancel(context.Background())
	ctx = blobstore.WithProgress(ctx, func(pr blobstore.Progress) {
		if pr.Parts == 3 {
			cancel()
		}
	})
	f, _ := os.Open(p)
	err = s.Put(ctx, team, d, int64(len(data)), f)
	f.Close()
	if err == nil {
		t.Fatal("a Put cancelled after three parts succeeded")
	}
	if _, err := s.Stat(context.Background(), team, d); !errors.Is(err, blobstore.ErrNotFound) {
		t.Fatalf("an upload cut short left a blob: %v", err)
	}
	if n, err := blobstore.UnfinishedPartsForTest(context.Background(), s, team, d); err != nil || n != 3 {
		t.Fatalf("the upload cut short keeps %d parts (%v), want 3", n, err)
	}
	// A part of other bytes (another writer's, a torn one) is not kept.
	if err := blobstore.PutPartForTest(context.Background(), s, team, d, 5, bytes.Repeat([]byte{7}, part)); err != nil {
		t.Fatal(err)
	}

	seen, err := put(context.Background())
	if err != nil {
		t.Fatalf("resuming the upload: %v", err)
	}
	last := seen[len(seen)-1]
	if last.Reused != 3 || last.Parts != 7 || last.Total != 7 || last.Sent != int64(len(data))-3*part || last.Bytes != int64(len(data)) {
		t.Fatalf("the resumed upload's progress: %+v, want 3 of 7 parts reused and the rest sent", last)
	}
	dst := filepath.Join(t.TempDir(), "back")
	if err := s.Get(context.Background(), team, d, dst); err != nil {
		t.Fatalf("the resumed upload's blob: %v", err)
	}
	if back, _ := os.ReadFile(dst); !bytes.Equal(back, data) {
		t.Fatal("the resumed upload's blob differs from the file")
	}
	if n, _ := blobstore.UnfinishedPartsForTest(context.Background(), s, team, d); n != -1 {
		t.Fatalf("the completed upload is still listed as unfinished (%d parts)", n)
	}
}

// A HashedFile is uploaded as its caller named it, without a second
// reading; were the name a lie, the blob is refused when fetched.
func TestS3PutHashedFile(t *testing.T) {
	cfg := sharedS3(t).Config("hashed")
	cfg.PartSize = 5 << 20
	s, err := blobstore.NewS3(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	data := make([]byte, 12<<20)
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
	d := blobstore.DigestOf(data)
	if err := s.Put(ctx, "team-h", d, int64(len(data)), blobstore.HashedFile{File: f}); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "back")
	if err := s.Get(ctx, "team-h", d, dst); err != nil {
		t.Fatal(err)
	}
	if back, _ := os.ReadFile(dst); !bytes.Equal(back, data) {
		t.Fatal("the blob differs from the file")
	}
	lie := blobstore.DigestOf(data[1:])
	if err := s.Put(ctx, "team-h", lie, int64(len(data)), blobstore.HashedFile{File: f}); err != nil {
		t.Fatal(err)
	}
	if err := s.Get(ctx, "team-h", lie, filepath.Join(t.TempDir(), "lie")); !errors.Is(err, blobstore.ErrCorrupt) {
		t.Fatalf("a blob stored under another's digest was fetched: %v", err)
	}
}
