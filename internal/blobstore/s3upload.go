package blobstore

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/minio/minio-go/v7"
)

// Resumable uploads.
//
// A file larger than one part goes up as a multipart upload under the
// blob's own key, its parts sent concurrently. Because the key is the
// blob's content address, an upload that a crash (or a lost connection)
// cut short names the very bytes a later Put of the same blob sends: that
// Put finds the unfinished upload, keeps each part already stored whose
// size is the part's and whose ETag is the MD5 of the local bytes at its
// offset (what S3-compatible services answer for a plain part), and sends
// only the others. A part of another size is sent again, and so is one
// whose ETag is an MD5 that differs. Some services answer another ETag
// for a part they stored in several chunks (SeaweedFS: a part of 16 MiB):
// such a part, of the right number and size, is kept unchecked, and once
// the upload is complete the blob is read back and hashed; if it is not
// blob d it is removed and the Put fails (ErrCorrupt), and the next Put
// starts anew. So a resumed upload never leaves a blob that is not its
// name (which every Get checks anyway).
// Unfinished uploads nobody resumes are aborted by AbortStale after the
// collector's grace period.

// Progress is reported after each part of an upload is stored.
type Progress struct {
	// Parts is how many of the upload's Total parts are stored, Reused of
	// them found stored by an earlier, interrupted upload (which had
	// stored Found parts: those not of this file's bytes are sent again).
	Parts, Reused, Found, Total int
	// Bytes is the bytes stored so far, Sent those sent by this upload.
	Bytes, Sent int64
}

type progressKey struct{}

// WithProgress returns a context whose S3 uploads call f after each part
// (from the uploading goroutines, one call at a time), after any function
// ctx already had.
func WithProgress(ctx context.Context, f func(Progress)) context.Context {
	if prev, ok := ctx.Value(progressKey{}).(func(Progress)); ok {
		inner := f
		f = func(p Progress) { prev(p); inner(p) }
	}
	return context.WithValue(ctx, progressKey{}, f)
}

func progressOf(ctx context.Context) func(Progress) {
	f, _ := ctx.Value(progressKey{}).(func(Progress))
	if f == nil {
		return func(Progress) {}
	}
	return f
}

// putFile uploads size bytes of f (blob d) to key k, resuming an
// unfinished upload of k if there is one.
func (s *S3) putFile(ctx context.Context, k string, d Digest, f io.ReaderAt, size int64) error {
	report := progressOf(ctx)
	if size <= int64(s.part) {
		_, err := s.c.PutObject(ctx, s.bucket, k, io.NewSectionReader(f, 0, size), size,
			minio.PutObjectOptions{ContentType: "application/octet-stream", DisableMultipart: true})
		if err == nil {
			report(Progress{Parts: 1, Total: 1, Bytes: size, Sent: size})
		}
		return err
	}
	core := minio.Core{Client: s.c}
	total := int((size + int64(s.part) - 1) / int64(s.part))
	partAt := func(n int) (off, length int64) {
		off = int64(n-1) * int64(s.part)
		return off, min(int64(s.part), size-off)
	}
	uploadID, stored, err := s.unfinished(ctx, core, k)
	if err != nil {
		return err
	}
	// The parts already stored that are this file's.
	done := map[int]minio.CompletePart{}
	unchecked := 0
	for _, p := range stored {
		if p.PartNumber < 1 || p.PartNumber > total {
			continue
		}
		off, length := partAt(p.PartNumber)
		if p.Size != length {
			continue
		}
		etag := strings.Trim(p.ETag, `"`)
		if plainMD5.MatchString(etag) {
			sum := md5.New()
			if _, err := io.Copy(sum, io.NewSectionReader(f, off, length)); err != nil {
				return err
			}
			if etag != hex.EncodeToString(sum.Sum(nil)) {
				continue
			}
		} else {
			unchecked++
		}
		done[p.PartNumber] = minio.CompletePart{PartNumber: p.PartNumber, ETag: p.ETag}
	}
	if uploadID == "" {
		if uploadID, err = core.NewMultipartUpload(ctx, s.bucket, k, minio.PutObjectOptions{ContentType: "application/octet-stream"}); err != nil {
			return err
		}
	}
	var (
		mu       sync.Mutex
		progress = Progress{Total: total, Reused: len(done), Found: len(stored), Parts: len(done)}
	)
	for n := range done {
		_, length := partAt(n)
		progress.Bytes += length
	}
	if len(stored) > 0 {
		report(progress) // what the interrupted upload left, before sending
	}
	todo := make(chan int, total)
	for n := 1; n <= total; n++ {
		if _, ok := done[n]; !ok {
			todo <- n
		}
	}
	close(todo)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for range min(int(s.conc), len(todo)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range todo {
				if ctx.Err() != nil {
					return
				}
				off, length := partAt(n)
				p, err := core.PutObjectPart(ctx, s.bucket, k, uploadID, n, io.NewSectionReader(f, off, length), length, minio.PutObjectPartOptions{})
				if err != nil {
					cancel(fmt.Errorf("part %d of %d: %w", n, total, err))
					return
				}
				mu.Lock()
				done[n] = minio.CompletePart{PartNumber: n, ETag: p.ETag}
				progress.Parts++
				progress.Bytes += length
				progress.Sent += length
				report(progress)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		// The parts stored stay for a retry to resume (AbortStale
		// removes them after the grace period).
		return err
	}
	parts := make([]minio.CompletePart, 0, total)
	for _, p := range done {
		parts = append(parts, p)
	}
	slices.SortFunc(parts, func(a, b minio.CompletePart) int { return a.PartNumber - b.PartNumber })
	if _, err := core.CompleteMultipartUpload(ctx, s.bucket, k, uploadID, parts, minio.PutObjectOptions{ContentType: "application/octet-stream"}); err != nil {
		return err
	}
	if unchecked > 0 {
		return s.checkStored(ctx, k, d, size)
	}
	return nil
}

// plainMD5 is an ETag that is the MD5 of a part's bytes.
var plainMD5 = regexp.MustCompile(`^[0-9a-f]{32}$`)

// checkStored reads the object at k back and removes it unless it is
// blob d.
func (s *S3) checkStored(ctx context.Context, k string, d Digest, size int64) error {
	obj, err := s.c.GetObject(ctx, s.bucket, k, minio.GetObjectOptions{})
	if err != nil {
		return err
	}
	defer obj.Close()
	vw := newVerifyingWriter(io.Discard)
	if _, err := io.Copy(vw, obj); err != nil {
		return fmt.Errorf("reading back a resumed upload: %w", err)
	}
	if err := vw.check(d, size); err != nil {
		_ = s.c.RemoveObject(context.WithoutCancel(ctx), s.bucket, k, minio.RemoveObjectOptions{})
		return fmt.Errorf("a resumed upload: %w", err)
	}
	return nil
}

// unfinished finds an unfinished multipart upload of key k and the parts
// it stored; "" when there is none.
func (s *S3) unfinished(ctx context.Context, core minio.Core, k string) (string, []minio.ObjectPart, error) {
	res, err := core.ListMultipartUploads(ctx, s.bucket, k, "", "", "", 100)
	if err != nil {
		return "", nil, fmt.Errorf("listing unfinished uploads: %w", err)
	}
	for _, u := range res.Uploads {
		if u.Key != k {
			continue
		}
		var parts []minio.ObjectPart
		marker := 0
		for {
			lp, err := core.ListObjectParts(ctx, s.bucket, k, u.UploadID, marker, 1000)
			if err != nil {
				if minio.ToErrorResponse(err).Code == minio.NoSuchUpload {
					break // completed or aborted meanwhile
				}
				return "", nil, fmt.Errorf("listing an unfinished upload's parts: %w", err)
			}
			parts = append(parts, lp.ObjectParts...)
			if !lp.IsTruncated || lp.NextPartNumberMarker <= marker {
				return u.UploadID, parts, nil
			}
			marker = lp.NextPartNumberMarker
		}
	}
	return "", nil, nil
}
