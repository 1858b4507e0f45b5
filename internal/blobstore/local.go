package blobstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Local is a Store in a directory of this machine: the one-box default.
type Local struct{ root string }

// NewLocal opens (creating) a local store rooted at dir.
func NewLocal(dir string) (*Local, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("blobstore: local store %q must be an absolute path", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return &Local{root: dir}, nil
}

func (l *Local) path(team string, d Digest) string {
	return filepath.Join(l.root, filepath.FromSlash(key(team, d)))
}

func (l *Local) Put(ctx context.Context, team string, d Digest, size int64, r io.Reader) error {
	if err := checkName(team, d); err != nil {
		return err
	}
	p := l.path(team, d)
	if fi, err := os.Stat(p); err == nil && fi.Size() == size {
		return nil // content-addressed: already there
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	_ = os.Remove(p) // a blob of the wrong size is not this one
	return writeVerified(p, d, size, func(w io.Writer) error {
		_, err := io.Copy(w, io.LimitReader(r, size+1))
		return err
	})
}

func (l *Local) Get(ctx context.Context, team string, d Digest, dst string) error {
	if err := checkName(team, d); err != nil {
		return err
	}
	f, err := os.Open(l.path(team, d))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %s of team %s", ErrNotFound, d, team)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	return writeVerified(dst, d, fi.Size(), func(w io.Writer) error {
		_, err := io.Copy(w, f)
		return err
	})
}

func (l *Local) Stat(ctx context.Context, team string, d Digest) (Info, error) {
	if err := checkName(team, d); err != nil {
		return Info{}, err
	}
	fi, err := os.Stat(l.path(team, d))
	if errors.Is(err, fs.ErrNotExist) {
		return Info{}, fmt.Errorf("%w: %s of team %s", ErrNotFound, d, team)
	}
	if err != nil {
		return Info{}, err
	}
	return Info{Digest: d, Size: fi.Size(), Modified: fi.ModTime()}, nil
}

func (l *Local) Delete(ctx context.Context, team string, d Digest) error {
	if err := checkName(team, d); err != nil {
		return err
	}
	if err := os.Remove(l.path(team, d)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func (l *Local) List(ctx context.Context, team string) ([]Info, error) {
	if err := checkTeam(team); err != nil {
		return nil, err
	}
	dir := filepath.Join(l.root, filepath.FromSlash(teamPrefix(team)))
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Info
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") || !e.Type().IsRegular() {
			continue // a Put under way
		}
		d, err := ParseDigest(DigestPrefix + e.Name())
		if err != nil {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		out = append(out, Info{Digest: d, Size: fi.Size(), Modified: fi.ModTime()})
	}
	return out, nil
}
