package templateclient

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// contextFile is a file, directory or symlink of the build context.
type contextFile struct {
	rel  string // slash-separated, relative to the context dir
	info fs.FileInfo
	link string // symlink target
}

// buildContext is the context directory, walked once, minus what its
// .dockerignore excludes.
type buildContext struct {
	dir   string
	files []contextFile // sorted by rel
}

func loadContext(dir string) (*buildContext, error) {
	ignore, err := readDockerignore(dir)
	if err != nil {
		return nil, err
	}
	bc := &buildContext{dir: dir}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel == "." {
			return nil
		}
		if ignore.excludes(rel) {
			if d.IsDir() && !ignore.hasNegation {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		f := contextFile{rel: rel, info: info}
		if info.Mode()&fs.ModeSymlink != 0 {
			if f.link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		if info.Mode().IsRegular() || info.IsDir() || f.link != "" {
			bc.files = append(bc.files, f)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading the build context: %w", err)
	}
	sort.Slice(bc.files, func(i, j int) bool { return bc.files[i].rel < bc.files[j].rel })
	return bc, nil
}

// match returns the files a COPY source selects: those its glob matches,
// and everything under the directories it matches, sorted.
func (bc *buildContext) match(src string) ([]contextFile, error) {
	pattern, err := cleanSource(src)
	if err != nil {
		return nil, err
	}
	var out []contextFile
	var dirs []string // matched directories, to take their contents
	for _, f := range bc.files {
		inDir := false
		for _, d := range dirs {
			if strings.HasPrefix(f.rel, d+"/") {
				inDir = true
				break
			}
		}
		if pattern == "" || inDir || matchPath(pattern, f.rel) {
			out = append(out, f)
			if f.info.IsDir() && !inDir {
				dirs = append(dirs, f.rel)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("COPY %s: no files match in %s", src, bc.dir)
	}
	return out, nil
}

// cleanSource turns a COPY source into a slash-separated pattern relative
// to the context dir; "" is the whole context.
func cleanSource(src string) (string, error) {
	s := path.Clean(filepath.ToSlash(src))
	if path.IsAbs(s) || s == ".." || strings.HasPrefix(s, "../") {
		return "", fmt.Errorf("COPY %s: the source must be a relative path inside the build context", src)
	}
	if s == "." {
		return "", nil
	}
	return s, nil
}

// matchPath reports whether a slash-separated path matches a glob in which
// each segment is a path.Match pattern and "**" matches any number of
// segments.
func matchPath(pattern, name string) bool {
	return matchSegments(strings.Split(pattern, "/"), strings.Split(name, "/"))
}

func matchSegments(pat, name []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			for i := 0; i <= len(name); i++ {
				if matchSegments(pat[1:], name[i:]) {
					return true
				}
			}
			return false
		}
		if len(name) == 0 {
			return false
		}
		if ok, _ := path.Match(pat[0], name[0]); !ok {
			return false
		}
		pat, name = pat[1:], name[1:]
	}
	return len(name) == 0
}

// filesHash is the cache key of a COPY step, computed like the SDK's
// calculateFilesHash: sha256 over "COPY <src> <dest>" and, for each file
// in order, its relative path, mode (st_mode, in decimal), size (0 for
// directories, which have no stable size) and content or link target.
func filesHash(src, dest string, files []contextFile, dir string) (string, error) {
	h := sha256.New()
	io.WriteString(h, "COPY "+src+" "+dest)
	for _, f := range files {
		io.WriteString(h, f.rel)
		io.WriteString(h, strconv.FormatUint(uint64(unixMode(f.info.Mode())), 10))
		size := f.info.Size()
		if f.info.IsDir() {
			size = 0
		}
		io.WriteString(h, strconv.FormatInt(size, 10))
		switch {
		case f.link != "":
			io.WriteString(h, f.link)
		case f.info.Mode().IsRegular():
			if err := copyFile(h, filepath.Join(dir, filepath.FromSlash(f.rel))); err != nil {
				return "", err
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func copyFile(w io.Writer, name string) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

// unixMode is a FileMode as a Unix st_mode.
func unixMode(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		u |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		u |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		u |= 0o1000
	}
	switch {
	case m.IsDir():
		u |= 0o040000
	case m&fs.ModeSymlink != 0:
		u |= 0o120000
	default:
		u |= 0o100000
	}
	return u
}

// writeArchive writes a gzip'd tar of files: entries named by their path
// relative to the context ("app.py", "sub/", "sub/x.txt"), owned by root,
// symlinks kept as links.
func writeArchive(w io.Writer, files []contextFile, dir string) error {
	zw := gzip.NewWriter(w)
	tw := tar.NewWriter(zw)
	for _, f := range files {
		hdr, err := tar.FileInfoHeader(f.info, f.link)
		if err != nil {
			return err
		}
		hdr.Name = f.rel
		if f.info.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if f.info.Mode().IsRegular() {
			if err := copyFileN(tw, filepath.Join(dir, filepath.FromSlash(f.rel)), f.info.Size()); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

// copyFileN copies exactly the size the header announced, so a file
// changing while archived cannot corrupt the archive.
func copyFileN(w io.Writer, name string, size int64) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.CopyN(w, f, size)
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if n < size {
		return fmt.Errorf("%s changed while being archived", name)
	}
	return nil
}

// ignoreRules are a .dockerignore's patterns: the last one matching a
// path, or one of its parent directories, decides; "!" re-includes.
type ignoreRules struct {
	patterns    []ignorePattern
	hasNegation bool
}

type ignorePattern struct {
	pattern string
	negate  bool
}

func readDockerignore(dir string) (*ignoreRules, error) {
	r := &ignoreRules{}
	b, err := os.ReadFile(filepath.Join(dir, ".dockerignore"))
	if errors.Is(err, fs.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		p := ignorePattern{}
		if strings.HasPrefix(line, "!") {
			p.negate = true
			r.hasNegation = true
			line = strings.TrimSpace(line[1:])
		}
		line = path.Clean(strings.TrimPrefix(filepath.ToSlash(line), "/"))
		if line == "." {
			continue
		}
		p.pattern = line
		r.patterns = append(r.patterns, p)
	}
	return r, nil
}

func (r *ignoreRules) excludes(rel string) bool {
	excluded := false
	for _, p := range r.patterns {
		if matchPathOrParent(p.pattern, rel) {
			excluded = !p.negate
		}
	}
	return excluded
}

func matchPathOrParent(pattern, rel string) bool {
	for {
		if matchPath(pattern, rel) {
			return true
		}
		i := strings.LastIndex(rel, "/")
		if i < 0 {
			return false
		}
		rel = rel[:i]
	}
}
