package blobstore

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// Options are `warren serve`'s --blob-store flags.
type Options struct {
	// URL is s3://bucket[/prefix], or an absolute directory (a Local
	// store); empty: no blob store.
	URL string
	// Endpoint is host[:port] or http(s)://host[:port] of an
	// S3-compatible service (plain host: HTTPS); empty: AWS.
	Endpoint  string
	Region    string
	PathStyle bool
	// AccessKey and SecretKeyFile (a file holding the secret key) sign
	// requests; else AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, else
	// CredentialsFile (an AWS shared credentials file).
	AccessKey, SecretKeyFile, CredentialsFile string
}

// Open opens the store o describes; nil, nil when o.URL is empty.
func Open(ctx context.Context, o Options) (Store, error) {
	switch {
	case o.URL == "":
		return nil, nil
	case strings.HasPrefix(o.URL, "s3://"):
	case filepath.IsAbs(o.URL):
		return NewLocal(o.URL)
	default:
		// Not echoed: a mistyped URL may hold a secret.
		return nil, fmt.Errorf("blobstore: --blob-store is neither s3://bucket[/prefix] nor an absolute directory")
	}
	bucket, prefix, err := ParseS3URL(o.URL)
	if err != nil {
		return nil, err
	}
	cfg := S3Config{Bucket: bucket, Prefix: prefix, Region: o.Region, PathStyle: o.PathStyle,
		AccessKey: o.AccessKey, CredentialsFile: o.CredentialsFile}
	if o.Endpoint != "" {
		host := o.Endpoint
		if strings.Contains(host, "://") {
			u, err := url.Parse(host)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
				return nil, fmt.Errorf("blobstore: --blob-store-endpoint is not [http(s)://]host[:port]")
			}
			host, cfg.Insecure = u.Host, u.Scheme == "http"
		}
		cfg.Endpoint = host
	}
	if o.SecretKeyFile != "" {
		b, err := os.ReadFile(o.SecretKeyFile)
		if err != nil {
			return nil, fmt.Errorf("blobstore: reading the secret key file: %w", err)
		}
		cfg.SecretKey = Secret(strings.TrimSpace(string(b)))
		if cfg.AccessKey == "" {
			return nil, fmt.Errorf("blobstore: a secret key file without an access key (--blob-store-access-key)")
		}
	} else if cfg.AccessKey != "" {
		return nil, fmt.Errorf("blobstore: an access key without its secret (--blob-store-secret-key-file)")
	}
	return NewS3(ctx, cfg)
}
