package imagepeer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A checkpoint (image.Store's snapshot dir: runsc's checkpoint files and
// the copy of the sandbox's disk) is a flat directory of regular files,
// mostly sparse (a disk image of gigabytes holds megabytes). It travels
// as lines and data, only what the files hold:
//
//	file NAME SIZE MODE
//	data OFFSET LENGTH   then LENGTH bytes
//	...
//	end
//	done
//
// with the SHA-256 of the stream in the DigestTrailer.

// maxSnapshotFiles bounds the files of a checkpoint a puller takes.
const maxSnapshotFiles = 64

// writeSnapshot writes the checkpoint dir as the stream above.
func writeSnapshot(out io.Writer, dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if !e.Type().IsRegular() {
			return fmt.Errorf("imagepeer: checkpoint %s holds %s, not a regular file", dir, e.Name())
		}
		names = append(names, e.Name())
	}
	sort.Strings(names)
	bw := bufio.NewWriterSize(out, 1<<20)
	for _, name := range names {
		if err := writeSparse(bw, filepath.Join(dir, name), name); err != nil {
			return err
		}
	}
	if _, err := bw.WriteString("done\n"); err != nil {
		return err
	}
	return bw.Flush()
}

// writeSparse writes one file: its data segments, found with SEEK_DATA
// and SEEK_HOLE.
func writeSparse(w *bufio.Writer, p, name string) error {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	fmt.Fprintf(w, "file %s %d %o\n", name, size, fi.Mode().Perm())
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
		fmt.Fprintf(w, "data %d %d\n", data, hole-data)
		if _, err := io.Copy(w, io.NewSectionReader(f, data, hole-data)); err != nil {
			return err
		}
		off = hole
	}
	_, err = w.WriteString("end\n")
	return err
}

// readSnapshot unpacks the stream into dir, a new empty directory. Names
// are single path elements, offsets and lengths within each file's size.
func readSnapshot(in io.Reader, dir string) error {
	br := bufio.NewReaderSize(in, 1<<20)
	line := func() ([]string, error) {
		s, err := br.ReadString('\n')
		if err != nil {
			return nil, fmt.Errorf("imagepeer: checkpoint stream cut short: %w", err)
		}
		return strings.Fields(s), nil
	}
	files := 0
	for {
		f, err := line()
		if err != nil {
			return err
		}
		if len(f) == 1 && f[0] == "done" {
			break
		}
		if len(f) != 4 || f[0] != "file" {
			return fmt.Errorf("imagepeer: checkpoint stream: unexpected %q", strings.Join(f, " "))
		}
		name := f[1]
		size, err1 := strconv.ParseInt(f[2], 10, 64)
		mode, err2 := strconv.ParseUint(f[3], 8, 32)
		if err1 != nil || err2 != nil || size < 0 || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
			return fmt.Errorf("imagepeer: checkpoint stream: bad file line %q", strings.Join(f, " "))
		}
		if files++; files > maxSnapshotFiles {
			return errors.New("imagepeer: checkpoint stream: too many files")
		}
		out, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, os.FileMode(mode&0o777))
		if err != nil {
			return err
		}
		err = readSegments(line, br, out, size)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	// What follows "done" (nothing, from a sound node) is digested too.
	_, err := io.Copy(io.Discard, br)
	return err
}

// readSegments writes a file's data segments at their offsets, then sets
// its size (the holes between stay holes).
func readSegments(line func() ([]string, error), br *bufio.Reader, out *os.File, size int64) error {
	for {
		f, err := line()
		if err != nil {
			return err
		}
		if len(f) == 1 && f[0] == "end" {
			return out.Truncate(size)
		}
		if len(f) != 3 || f[0] != "data" {
			return fmt.Errorf("imagepeer: checkpoint stream: unexpected %q", strings.Join(f, " "))
		}
		off, err1 := strconv.ParseInt(f[1], 10, 64)
		n, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil || off < 0 || n < 0 || off > size || n > size-off {
			return fmt.Errorf("imagepeer: checkpoint stream: bad segment %q of a %d-byte file", strings.Join(f, " "), size)
		}
		if _, err := io.CopyN(io.NewOffsetWriter(out, off), br, n); err != nil {
			return err
		}
	}
}

// pullSnapshot brings checkpoint id into the image store.
func (p *Puller) pullSnapshot(ctx context.Context, base, node, id string) error {
	return p.fetch(ctx, base+"snapshots/"+id, "checkpoint "+id+" from node "+node,
		p.Images.SnapshotTemp, p.Images.SnapshotDir(id), readSnapshot)
}
