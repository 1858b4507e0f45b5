// Package blobstore keeps Warren's durable state (a paused sandbox's
// checkpoint and disk) as content-addressed blobs, in a local directory
// (the one-box default) or in S3-compatible object storage, so that it
// outlives the node that wrote it.
//
// A blob is named by its team and the SHA-256 of its bytes: the key is
// <prefix>/teams/<team>/sha256/<hex>. Tenants never name keys; Warren
// looks a blob up with the team of the sandbox that owns it, so a team
// that guessed another's digest still finds nothing under its own
// prefix. An empty or malformed team matches nothing (ErrInvalid).
//
// Every Get is verified: the bytes are hashed on the way to the local
// file and a blob whose size or digest differs from its name is refused
// (ErrCorrupt) and nothing is left at the destination.
package blobstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Store holds blobs by team and digest.
type Store interface {
	// Put stores size bytes read from r as the blob d of team. The bytes
	// are hashed on the way: when they are not d, nothing is kept and the
	// error wraps ErrCorrupt. An *os.File is uploaded in parts
	// concurrently by the S3 store.
	Put(ctx context.Context, team string, d Digest, size int64, r io.Reader) error
	// Get writes blob d of team to the new file dst (written aside and
	// renamed into place once verified).
	Get(ctx context.Context, team string, d Digest, dst string) error
	// Stat reports a blob's size; ErrNotFound if team has none such.
	Stat(ctx context.Context, team string, d Digest) (Info, error)
	// Delete removes a blob; removing a missing one is not an error.
	Delete(ctx context.Context, team string, d Digest) error
	// List lists team's blobs.
	List(ctx context.Context, team string) ([]Info, error)
}

// HashedFile is a file its caller wrote and hashed on the way (size bytes
// from its start are the blob Put names), which nothing else writes: the
// S3 store uploads it without reading it once more to verify it first
// (an *os.File is verified: it is read at offsets, concurrently, so the
// upload cannot hash it on the way). A pause's pack is one, hashed while
// it is packed; at 500 MiB the second reading costs ~1.5 s here.
type HashedFile struct{ *os.File }

// Info describes a stored blob.
type Info struct {
	Digest   Digest
	Size     int64
	Modified time.Time
}

var (
	// ErrNotFound: no such blob for that team.
	ErrNotFound = errors.New("blobstore: blob not found")
	// ErrCorrupt: the bytes are not those the blob is named after.
	ErrCorrupt = errors.New("blobstore: blob corrupt")
	// ErrInvalid: a malformed team or digest.
	ErrInvalid = errors.New("blobstore: invalid name")
)

// Digest is a blob's SHA-256.
type Digest struct{ hex string }

// DigestPrefix starts a Digest's string form.
const DigestPrefix = "sha256:"

var hexPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// ParseDigest parses "sha256:<64 lowercase hex digits>".
func ParseDigest(s string) (Digest, error) {
	h, ok := strings.CutPrefix(s, DigestPrefix)
	if !ok || !hexPattern.MatchString(h) {
		return Digest{}, fmt.Errorf("%w: digest %q", ErrInvalid, s)
	}
	return Digest{hex: h}, nil
}

// DigestOf is the digest of the bytes b.
func DigestOf(b []byte) Digest {
	sum := sha256.Sum256(b)
	return Digest{hex: hex.EncodeToString(sum[:])}
}

func (d Digest) String() string { return DigestPrefix + d.hex }

// IsZero reports the zero Digest, which names no blob.
func (d Digest) IsZero() bool { return d.hex == "" }

// Hex is the digest's hexadecimal digits.
func (d Digest) Hex() string { return d.hex }

// FileDigest hashes a file, returning its digest and size.
func FileDigest(path string) (Digest, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return Digest{}, 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return Digest{}, 0, err
	}
	return Digest{hex: hex.EncodeToString(h.Sum(nil))}, n, nil
}

// PutFile stores the file at path as a blob of team and returns its
// digest and size.
func PutFile(ctx context.Context, s Store, team, path string) (Digest, int64, error) {
	d, size, err := FileDigest(path)
	if err != nil {
		return Digest{}, 0, err
	}
	f, err := os.Open(path)
	if err != nil {
		return Digest{}, 0, err
	}
	defer f.Close()
	return d, size, s.Put(ctx, team, d, size, f)
}

// teamPattern is what a team ID may be in a key: one path element.
var teamPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// checkName fails closed on an empty or malformed team and the zero
// digest.
func checkName(team string, d Digest) error {
	if err := checkTeam(team); err != nil {
		return err
	}
	if d.IsZero() {
		return fmt.Errorf("%w: no digest", ErrInvalid)
	}
	return nil
}

func checkTeam(team string) error {
	if !teamPattern.MatchString(team) || team == "." || team == ".." {
		return fmt.Errorf("%w: team %q", ErrInvalid, team)
	}
	return nil
}

// key is a blob's name below the store's prefix.
func key(team string, d Digest) string { return teamPrefix(team) + d.hex }

func teamPrefix(team string) string { return "teams/" + team + "/sha256/" }

// verifyingWriter hashes and counts what is written through it.
type verifyingWriter struct {
	w    io.Writer
	h    interface{ Sum([]byte) []byte }
	hw   io.Writer
	size int64
}

func newVerifyingWriter(w io.Writer) *verifyingWriter {
	h := sha256.New()
	return &verifyingWriter{w: w, h: h, hw: h}
}

func (v *verifyingWriter) Write(b []byte) (int, error) {
	n, err := v.w.Write(b)
	v.hw.Write(b[:n])
	v.size += int64(n)
	return n, err
}

// check compares what went through with the blob's name.
func (v *verifyingWriter) check(d Digest, size int64) error {
	got := hex.EncodeToString(v.h.Sum(nil))
	if v.size != size {
		return fmt.Errorf("%w: blob %s has %d bytes, %d expected (truncated or replaced)", ErrCorrupt, d, v.size, size)
	}
	if got != d.hex {
		return fmt.Errorf("%w: blob %s hashes to sha256:%s", ErrCorrupt, d, got)
	}
	return nil
}

// writeVerified writes what fill writes to a temporary file beside dst,
// checks it against d and size, and renames it into place; on any
// failure nothing is left.
func writeVerified(dst string, d Digest, size int64, fill func(io.Writer) error) (err error) {
	if _, err := os.Lstat(dst); err == nil {
		return fmt.Errorf("blobstore: %s already exists", dst)
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".part-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	vw := newVerifyingWriter(tmp)
	if err := fill(vw); err != nil {
		return err
	}
	if err := vw.check(d, size); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}
