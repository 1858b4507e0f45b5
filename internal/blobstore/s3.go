package blobstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Config says where an S3-compatible store is and how to sign in.
type S3Config struct {
	// Bucket and Prefix come from an s3://bucket/prefix URL (ParseS3URL).
	Bucket, Prefix string
	// Endpoint is host[:port]; empty means AWS (s3.amazonaws.com).
	Endpoint string
	// Insecure speaks plain HTTP to Endpoint (a store on loopback or a
	// private network).
	Insecure bool
	Region   string
	// PathStyle addresses the bucket in the path (MinIO, SeaweedFS, Ceph)
	// rather than the host name.
	PathStyle bool
	// AccessKey and SecretKey, when set, sign requests; otherwise the
	// environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
	// AWS_SESSION_TOKEN) and then the shared credentials file
	// (CredentialsFile, or AWS_SHARED_CREDENTIALS_FILE, or
	// ~/.aws/credentials, profile AWS_PROFILE) are tried.
	AccessKey    string
	SecretKey    Secret
	SessionToken Secret
	// CredentialsFile is an AWS shared credentials file.
	CredentialsFile string
	// PartSize is the size of a multipart upload's parts (default 16 MiB)
	// and Concurrency how many are sent at once (default 4). An upload
	// cut short is resumed by the next Put of the same blob
	// (s3upload.go).
	PartSize    uint64
	Concurrency uint
	// Transport, when set, carries the requests (tests).
	Transport http.RoundTripper
}

// Secret is a credential: it prints and logs as [redacted].
type Secret string

func (Secret) String() string                 { return "[redacted]" }
func (Secret) GoString() string               { return "[redacted]" }
func (Secret) LogValue() slog.Value           { return slog.StringValue("[redacted]") }
func (s Secret) MarshalText() ([]byte, error) { return []byte("[redacted]"), nil }

// ParseS3URL reads s3://bucket[/prefix] into c's Bucket and Prefix.
func ParseS3URL(raw string) (bucket, prefix string, err error) {
	u, err := url.Parse(raw)
	if err == nil && u.User != nil {
		// Never echoed: it may hold a secret.
		return "", "", errors.New("blobstore: the store URL must not hold credentials (use --blob-store-access-key and --blob-store-secret-key-file)")
	}
	if err != nil || u.Scheme != "s3" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return "", "", errors.New("blobstore: the store URL is not s3://bucket[/prefix]")
	}
	prefix = strings.Trim(path.Clean("/"+u.Path), "/")
	return u.Host, prefix, nil
}

// S3 is a Store in an S3-compatible bucket.
type S3 struct {
	c      *minio.Client
	bucket string
	prefix string // "" or ending in "/"
	part   uint64
	conc   uint
}

// NewS3 connects to the bucket (it must exist; NewS3 checks it does).
func NewS3(ctx context.Context, cfg S3Config) (*S3, error) {
	if cfg.Bucket == "" {
		return nil, errors.New("blobstore: s3 store without a bucket")
	}
	endpoint := cfg.Endpoint
	if endpoint == "" {
		endpoint = "s3.amazonaws.com"
	}
	lookup := minio.BucketLookupAuto
	if cfg.PathStyle {
		lookup = minio.BucketLookupPath
	}
	c, err := minio.New(endpoint, &minio.Options{
		Creds:        s3Credentials(cfg),
		Secure:       !cfg.Insecure,
		Region:       cfg.Region,
		BucketLookup: lookup,
		Transport:    cfg.Transport,
	})
	if err != nil {
		return nil, fmt.Errorf("blobstore: s3 client: %w", err)
	}
	s := &S3{c: c, bucket: cfg.Bucket, part: cfg.PartSize, conc: cfg.Concurrency}
	if cfg.Prefix != "" {
		s.prefix = strings.Trim(cfg.Prefix, "/") + "/"
	}
	if s.part == 0 {
		s.part = 16 << 20
	}
	if s.conc == 0 {
		s.conc = 4
	}
	ok, err := c.BucketExists(ctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("blobstore: reaching bucket %s at %s: %w", cfg.Bucket, endpoint, err)
	}
	if !ok {
		return nil, fmt.Errorf("blobstore: bucket %s does not exist at %s", cfg.Bucket, endpoint)
	}
	return s, nil
}

// s3Credentials chains the configured keys, the environment and the
// shared credentials file, in that order.
func s3Credentials(cfg S3Config) *credentials.Credentials {
	var chain []credentials.Provider
	if cfg.AccessKey != "" {
		chain = append(chain, &credentials.Static{Value: credentials.Value{
			AccessKeyID: cfg.AccessKey, SecretAccessKey: string(cfg.SecretKey),
			SessionToken: string(cfg.SessionToken), SignerType: credentials.SignatureV4,
		}})
	}
	chain = append(chain, &credentials.EnvAWS{}, &credentials.FileAWSCredentials{Filename: cfg.CredentialsFile})
	return credentials.NewChainCredentials(chain)
}

func (s *S3) key(team string, d Digest) string { return s.prefix + key(team, d) }

func notFound(err error) bool {
	code := minio.ToErrorResponse(err).Code
	return code == minio.NoSuchKey || code == "NotFound"
}

func (s *S3) Put(ctx context.Context, team string, d Digest, size int64, r io.Reader) error {
	if err := checkName(team, d); err != nil {
		return err
	}
	if info, err := s.Stat(ctx, team, d); err == nil && info.Size == size {
		progressOf(ctx)(Progress{Bytes: size}) // nothing sent
		return nil                             // content-addressed: already there
	}
	opts := minio.PutObjectOptions{
		ContentType: "application/octet-stream",
		PartSize:    s.part,
		NumThreads:  s.conc,
	}
	k := s.key(team, d)
	if f, ok := r.(HashedFile); ok {
		if err := s.putFile(ctx, k, d, f.File, size); err != nil {
			return fmt.Errorf("blobstore: uploading %s: %w", d, err)
		}
		return nil
	}
	if f, ok := r.(*os.File); ok {
		// Parts are read at their offsets, concurrently: verify the file
		// as a whole first, so that what is sent is what is named.
		if err := verifyReaderAt(f, d, size); err != nil {
			return err
		}
		if err := s.putFile(ctx, k, d, f, size); err != nil {
			return fmt.Errorf("blobstore: uploading %s: %w", d, err)
		}
		return nil
	}
	opts.ConcurrentStreamParts = true
	vw := newVerifyingWriter(io.Discard)
	if _, err := s.c.PutObject(ctx, s.bucket, k, io.TeeReader(io.LimitReader(r, size), vw), size, opts); err != nil {
		return fmt.Errorf("blobstore: uploading %s: %w", d, err)
	}
	if err := vw.check(d, size); err != nil {
		_ = s.c.RemoveObject(context.WithoutCancel(ctx), s.bucket, k, minio.RemoveObjectOptions{})
		return err
	}
	progressOf(ctx)(Progress{Parts: 1, Total: 1, Bytes: size, Sent: size})
	return nil
}

// verifyReaderAt hashes size bytes of r from its start.
func verifyReaderAt(r io.ReaderAt, d Digest, size int64) error {
	vw := newVerifyingWriter(io.Discard)
	if _, err := io.Copy(vw, io.NewSectionReader(r, 0, size)); err != nil {
		return err
	}
	return vw.check(d, size)
}

func (s *S3) Get(ctx context.Context, team string, d Digest, dst string) error {
	if err := checkName(team, d); err != nil {
		return err
	}
	obj, err := s.c.GetObject(ctx, s.bucket, s.key(team, d), minio.GetObjectOptions{})
	if err != nil {
		return fmt.Errorf("blobstore: downloading %s: %w", d, err)
	}
	defer obj.Close()
	info, err := obj.Stat()
	if notFound(err) {
		return fmt.Errorf("%w: %s of team %s", ErrNotFound, d, team)
	}
	if err != nil {
		return fmt.Errorf("blobstore: downloading %s: %w", d, err)
	}
	return writeVerified(dst, d, info.Size, func(w io.Writer) error {
		_, err := io.Copy(w, obj)
		if err != nil {
			return fmt.Errorf("blobstore: downloading %s: %w", d, err)
		}
		return nil
	})
}

func (s *S3) Stat(ctx context.Context, team string, d Digest) (Info, error) {
	if err := checkName(team, d); err != nil {
		return Info{}, err
	}
	oi, err := s.c.StatObject(ctx, s.bucket, s.key(team, d), minio.StatObjectOptions{})
	if notFound(err) {
		return Info{}, fmt.Errorf("%w: %s of team %s", ErrNotFound, d, team)
	}
	if err != nil {
		return Info{}, fmt.Errorf("blobstore: %s: %w", d, err)
	}
	return Info{Digest: d, Size: oi.Size, Modified: oi.LastModified}, nil
}

func (s *S3) Delete(ctx context.Context, team string, d Digest) error {
	if err := checkName(team, d); err != nil {
		return err
	}
	err := s.c.RemoveObject(ctx, s.bucket, s.key(team, d), minio.RemoveObjectOptions{})
	if err != nil && !notFound(err) {
		return fmt.Errorf("blobstore: removing %s: %w", d, err)
	}
	return nil
}

func (s *S3) List(ctx context.Context, team string) ([]Info, error) {
	if err := checkTeam(team); err != nil {
		return nil, err
	}
	p := s.prefix + teamPrefix(team)
	var out []Info
	for oi := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: p, Recursive: true}) {
		if oi.Err != nil {
			return nil, fmt.Errorf("blobstore: listing team %s: %w", team, oi.Err)
		}
		d, err := ParseDigest(DigestPrefix + strings.TrimPrefix(oi.Key, p))
		if err != nil {
			continue
		}
		out = append(out, Info{Digest: d, Size: oi.Size, Modified: oi.LastModified})
	}
	return out, nil
}

// AbortStale removes the parts of multipart uploads under the store's
// prefix begun before before: a node that crashed mid-upload leaves them,
// and the service keeps (and bills) them until they are aborted.
func (s *S3) AbortStale(ctx context.Context, before time.Time) (int, error) {
	n := 0
	var errs []error
	for u := range s.c.ListIncompleteUploads(ctx, s.bucket, s.prefix+"teams/", true) {
		if u.Err != nil {
			return n, fmt.Errorf("blobstore: listing unfinished uploads: %w", u.Err)
		}
		if !u.Initiated.Before(before) {
			continue
		}
		if err := s.c.RemoveIncompleteUpload(ctx, s.bucket, u.Key); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
