package blobstore

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/minio/minio-go/v7"
)

// OverwriteForTest replaces blob d's bytes behind the store's back.
func OverwriteForTest(ctx context.Context, s Store, team string, d Digest, b []byte) error {
	switch s := s.(type) {
	case *S3:
		_, err := s.c.PutObject(ctx, s.bucket, s.key(team, d), bytes.NewReader(b), int64(len(b)), minio.PutObjectOptions{})
		return err
	case *Local:
		return os.WriteFile(filepath.Join(s.root, filepath.FromSlash(key(team, d))), b, 0o600)
	}
	return fmt.Errorf("no such store %T", s)
}

// StartUploadForTest begins a multipart upload under team and leaves it
// unfinished, as a crash would.
func StartUploadForTest(ctx context.Context, s *S3, team string) error {
	core := minio.Core{Client: s.c}
	_, err := core.NewMultipartUpload(ctx, s.bucket, s.prefix+teamPrefix(team)+"unfinished", minio.PutObjectOptions{})
	return err
}

// PutPartForTest stores data as part n of an unfinished upload of blob
// d (begun if there is none), as an interrupted upload would have left
// it.
func PutPartForTest(ctx context.Context, s *S3, team string, d Digest, n int, data []byte) error {
	core := minio.Core{Client: s.c}
	k := s.key(team, d)
	id, _, err := s.unfinished(ctx, core, k)
	if err == nil && id == "" {
		id, err = core.NewMultipartUpload(ctx, s.bucket, k, minio.PutObjectOptions{})
	}
	if err != nil {
		return err
	}
	_, err = core.PutObjectPart(ctx, s.bucket, k, id, n, bytes.NewReader(data), int64(len(data)), minio.PutObjectPartOptions{})
	return err
}

// UnfinishedPartsForTest counts the parts of blob d's unfinished upload.
func UnfinishedPartsForTest(ctx context.Context, s *S3, team string, d Digest) (int, error) {
	id, parts, err := s.unfinished(ctx, minio.Core{Client: s.c}, s.key(team, d))
	if id == "" && err == nil {
		return -1, nil
	}
	return len(parts), err
}

// PartETagsForTest lists the ETags of blob d's unfinished upload's parts.
func PartETagsForTest(ctx context.Context, s *S3, team string, d Digest) []string {
	_, parts, _ := s.unfinished(ctx, minio.Core{Client: s.c}, s.key(team, d))
	var out []string
	for _, p := range parts {
		out = append(out, fmt.Sprintf("%d:%d:%s", p.PartNumber, p.Size, p.ETag))
	}
	return out
}
