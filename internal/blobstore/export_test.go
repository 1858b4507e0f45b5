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
