package blobstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/blobstore"
)

func TestOpenRefusesBadOptions(t *testing.T) {
	ctx := context.Background()
	for name, o := range map[string]blobstore.Options{
		"relative dir":           {URL: "blobs"},
		"other scheme":           {URL: "gs://bucket"},
		"no bucket":              {URL: "s3:///prefix"},
		"endpoint with a path":   {URL: "s3://b", Endpoint: "http://127.0.0.1:1/x"},
		"endpoint scheme":        {URL: "s3://b", Endpoint: "ftp://127.0.0.1:1"},
		"key without secret":     {URL: "s3://b", Endpoint: "http://127.0.0.1:1", AccessKey: "k"},
		"missing secret file":    {URL: "s3://b", Endpoint: "http://127.0.0.1:1", AccessKey: "k", SecretKeyFile: "/nonexistent"},
		"query in the URL":       {URL: "s3://b/p?x=1"},
		"credentials in the URL": {URL: "s3://user:pass@b/p"},
		"credentials elsewhere":  {URL: "https://user:pass@b/p"},
		"credentials unparsed":   {URL: "s3://user:pass%zz@b/p"},
		"endpoint credentials":   {URL: "s3://b", Endpoint: "http://user:pass@127.0.0.1:1/x"},
	} {
		if _, err := blobstore.Open(ctx, o); err == nil {
			t.Errorf("%s: opened", name)
		} else if strings.Contains(err.Error(), "pass") {
			t.Errorf("%s: the error shows a credential: %v", name, err)
		}
	}
	if s, err := blobstore.Open(ctx, blobstore.Options{}); s != nil || err != nil {
		t.Errorf("no URL: %v %v", s, err)
	}
	if _, err := blobstore.Open(ctx, blobstore.Options{URL: t.TempDir()}); err != nil {
		t.Errorf("a directory: %v", err)
	}
	bucket, prefix, err := blobstore.ParseS3URL("s3://bucket/a//b/")
	if err != nil || bucket != "bucket" || prefix != "a/b" {
		t.Errorf("ParseS3URL: %q %q %v", bucket, prefix, err)
	}
}
