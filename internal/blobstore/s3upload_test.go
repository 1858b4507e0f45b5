package blobstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/warren-sandbox/warren/internal/blobstore"
)

// An upload cut short after some parts is resumed by the next Put of the
// same blob: the parts stored are not sent again, and the blob comes back
// whole. A stored part whose bytes are not the file's never makes a blob:
// it is sent again (its ETag is an MD5 that differs) or, when the service
// answers an ETag that is not the part's MD5 (SeaweedFS, for parts it
// stores in several chunks), the completed blob is read back, refused and
// removed, and the next Put stores it whole. Both part sizes run: 5 MiB
// (plain MD5 ETags) and 16 MiB (the default).
func TestS3UploadResumes(t *testing.T) {
	for _, part := range []int{5 << 20, 16 << 20} {
		t.Run(fmt.Sprintf("%dMiB", part>>20), func(t *testing.T) { testUploadResumes(t, part) })
	}
}

func testUploadResumes(t *testing.T, part int) {
	cfg := sharedS3(t).Config(fmt.Sprintf("resume-%d", part))
	cfg.PartSize, cfg.Concurrency = uint64(part), 1
	s, err := blobstore.NewS3(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	const team = "team-r"
	ctx := context.Background()
	newFile := func() ([]byte, string, blobstore.Digest) {
		data := make([]byte, 6*part+12345) // 7 parts
		rand.Read(data)
		p := filepath.Join(t.TempDir(), "pack")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return data, p, blobstore.DigestOf(data)
	}
	put := func(ctx context.Context, p string, d blobstore.Digest, size int) (blobstore.Progress, error) {
		var last blobstore.Progress
		ctx = blobstore.WithProgress(ctx, func(pr blobstore.Progress) { last = pr })
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		return last, s.Put(ctx, team, d, int64(size), f)
	}
	// cutShort puts the file and cancels the upload after three parts,
	// as a crash would.
	cutShort := func(p string, d blobstore.Digest, size int) {
		t.Helper()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		ctx = blobstore.WithProgress(ctx, func(pr blobstore.Progress) {
			if pr.Parts == 3 {
				cancel()
			}
		})
		if _, err := put(ctx, p, d, size); err == nil {
			t.Fatal("a Put cancelled after three parts succeeded")
		}
		if _, err := s.Stat(context.Background(), team, d); !errors.Is(err, blobstore.ErrNotFound) {
			t.Fatalf("an upload cut short left a blob: %v", err)
		}
		if n, err := blobstore.UnfinishedPartsForTest(context.Background(), s, team, d); err != nil || n != 3 {
			t.Fatalf("the upload cut short keeps %d parts (%v), want 3", n, err)
		}
	}
	whole := func(d blobstore.Digest, data []byte) {
		t.Helper()
		dst := filepath.Join(t.TempDir(), "back")
		if err := s.Get(ctx, team, d, dst); err != nil {
			t.Fatalf("the blob: %v", err)
		}
		if back, _ := os.ReadFile(dst); !bytes.Equal(back, data) {
			t.Fatal("the blob differs from the file")
		}
		if n, _ := blobstore.UnfinishedPartsForTest(ctx, s, team, d); n != -1 {
			t.Fatalf("the completed upload is still listed as unfinished (%d parts)", n)
		}
	}

	data, p, d := newFile()
	cutShort(p, d, len(data))
	t.Logf("parts stored: %v", blobstore.PartETagsForTest(ctx, s, team, d))
	last, err := put(ctx, p, d, len(data))
	if err != nil {
		t.Fatalf("resuming the upload: %v", err)
	}
	if last.Reused != 3 || last.Parts != 7 || last.Total != 7 || last.Sent != int64(len(data)-3*part) || last.Bytes != int64(len(data)) {
		t.Fatalf("the resumed upload's progress: %+v, want 3 of 7 parts reused and the rest sent", last)
	}
	whole(d, data)

	// A part of other bytes (another writer's, a torn one) at 5.
	data, p, d = newFile()
	cutShort(p, d, len(data))
	if err := blobstore.PutPartForTest(ctx, s, team, d, 5, bytes.Repeat([]byte{7}, part)); err != nil {
		t.Fatal(err)
	}
	last, err = put(ctx, p, d, len(data))
	switch {
	case err == nil:
		if last.Reused != 3 {
			t.Fatalf("the resumed upload's progress: %+v, want the 3 good parts reused and the bad one sent", last)
		}
	case errors.Is(err, blobstore.ErrCorrupt):
		t.Logf("the blob a bad part made was refused: %v", err)
		if _, err := s.Stat(ctx, team, d); !errors.Is(err, blobstore.ErrNotFound) {
			t.Fatalf("the refused blob stays: %v", err)
		}
		if _, err := put(ctx, p, d, len(data)); err != nil {
			t.Fatalf("the Put after the refused one: %v", err)
		}
	default:
		t.Fatalf("resuming an upload with a bad part: %v", err)
	}
	whole(d, data)
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
