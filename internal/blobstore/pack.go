package blobstore

import (
	"bufio"
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

	"golang.org/x/sys/unix"
)

// A directory travels to the store as one blob, a pack: its directories
// and regular files, each file as its data runs only (found with
// SEEK_DATA and SEEK_HOLE), so that a disk image of gigabytes holding
// megabytes costs megabytes in the store and its holes come back as
// holes:
//
//	warren-pack 1
//	dir  REL MODE
//	file REL SIZE MODE
//	data OFFSET LENGTH   then LENGTH bytes
//	end
//	done
//
// REL is a slash-separated relative path without "." or ".." elements;
// symbolic links, devices and the like are refused when packing (the
// sandbox directories packed hold none: a paused sandbox with a disk
// limit keeps its writable layer in disk.img).

const packMagic = "warren-pack 1"

// Pack limits: what Unpack takes from a blob.
const (
	maxPackEntries = 4096
	maxPackLine    = 4096
)

// Pack writes dir as a pack to w.
func Pack(w io.Writer, dir string) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	fmt.Fprintf(bw, "%s\n", packMagic)
	var rels []string
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if !e.IsDir() && !e.Type().IsRegular() {
			return fmt.Errorf("blobstore: packing %s: %s is neither a file nor a directory", dir, rel)
		}
		rels = append(rels, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(rels) // a parent sorts before its children
	for _, rel := range rels {
		if err := packEntry(bw, filepath.Join(dir, filepath.FromSlash(rel)), rel); err != nil {
			return err
		}
	}
	if _, err := bw.WriteString("done\n"); err != nil {
		return err
	}
	return bw.Flush()
}

func packEntry(w *bufio.Writer, p, rel string) error {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.IsDir() {
		_, err := fmt.Fprintf(w, "dir %s %o\n", rel, fi.Mode().Perm())
		return err
	}
	if strings.ContainsAny(rel, " \n") {
		return fmt.Errorf("blobstore: packing: file name %q has a space or newline", rel)
	}
	size := fi.Size()
	fmt.Fprintf(w, "file %s %d %o\n", rel, size, fi.Mode().Perm())
	fd := int(f.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // a hole to the end
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		hole = min(hole, size)
		fmt.Fprintf(w, "data %d %d\n", data, hole-data)
		if _, err := io.Copy(w, io.NewSectionReader(f, data, hole-data)); err != nil {
			return err
		}
		off = hole
	}
	_, err = w.WriteString("end\n")
	return err
}

// Unpack writes the pack read from r into dir, a new empty directory
// (created). On error what was written is left for the caller to remove.
func Unpack(r io.Reader, dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	br := bufio.NewReaderSize(r, 1<<20)
	line := func() ([]string, error) {
		s, err := br.ReadSlice('\n')
		if err != nil {
			return nil, fmt.Errorf("%w: pack cut short or malformed: %v", ErrCorrupt, err)
		}
		if len(s) > maxPackLine {
			return nil, fmt.Errorf("%w: pack line too long", ErrCorrupt)
		}
		return strings.Fields(string(s)), nil
	}
	bad := func(f []string) error {
		return fmt.Errorf("%w: pack: unexpected %q", ErrCorrupt, strings.Join(f, " "))
	}
	f, err := line()
	if err != nil {
		return err
	}
	if strings.Join(f, " ") != packMagic {
		return bad(f)
	}
	for n := 0; ; n++ {
		if n > maxPackEntries {
			return fmt.Errorf("%w: pack has more than %d entries", ErrCorrupt, maxPackEntries)
		}
		f, err := line()
		if err != nil {
			return err
		}
		switch {
		case len(f) == 1 && f[0] == "done":
			return nil
		case len(f) == 3 && f[0] == "dir":
			p, mode, err := packPath(dir, f[1], f[2])
			if err != nil {
				return err
			}
			if err := os.Mkdir(p, mode); err != nil {
				return err
			}
		case len(f) == 4 && f[0] == "file":
			p, mode, err := packPath(dir, f[1], f[3])
			if err != nil {
				return err
			}
			size, err := strconv.ParseInt(f[2], 10, 64)
			if err != nil || size < 0 {
				return bad(f)
			}
			out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, mode)
			if err != nil {
				return err
			}
			err = unpackData(line, br, out, size)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return bad(f)
		}
	}
}

// packPath checks a pack's relative path and mode and resolves the path
// inside dir. Parents come before children in a pack, and are made by
// Unpack itself, so no element of the path can be a link.
func packPath(dir, rel, mode string) (string, os.FileMode, error) {
	m, err := strconv.ParseUint(mode, 8, 32)
	if err != nil || m > 0o777 || rel == "" || path.IsAbs(rel) || path.Clean(rel) != rel || strings.HasPrefix(rel, "../") || rel == ".." || strings.ContainsRune(rel, 0) {
		return "", 0, fmt.Errorf("%w: pack: bad entry %q %q", ErrCorrupt, rel, mode)
	}
	return filepath.Join(dir, filepath.FromSlash(rel)), os.FileMode(m), nil
}

// unpackData writes a file's data runs at their offsets, then sets its
// size; the holes between stay holes.
func unpackData(line func() ([]string, error), br *bufio.Reader, out *os.File, size int64) error {
	for {
		f, err := line()
		if err != nil {
			return err
		}
		if len(f) == 1 && f[0] == "end" {
			return out.Truncate(size)
		}
		if len(f) != 3 || f[0] != "data" {
			return fmt.Errorf("%w: pack: unexpected %q", ErrCorrupt, strings.Join(f, " "))
		}
		off, err1 := strconv.ParseInt(f[1], 10, 64)
		n, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil || off < 0 || n < 0 || off > size || n > size-off {
			return fmt.Errorf("%w: pack: data run %q outside the file", ErrCorrupt, strings.Join(f, " "))
		}
		if _, err := io.Copy(io.NewOffsetWriter(out, off), io.LimitReader(br, n)); err != nil {
			return err
		}
		if fi, _ := out.Stat(); fi != nil && fi.Size() < off+n {
			return fmt.Errorf("%w: pack cut short in a data run", ErrCorrupt)
		}
	}
}
