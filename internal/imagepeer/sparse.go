package imagepeer

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// A sparse regular file of a layer (a build step's `truncate -s 100G`, a
// database's preallocated file) travels with its holes left out, when the
// puller asks for that with HolesHeader: its tar entry carries the PAX
// record sparseSizeKey (the file's size) and, as its content, the body
//
//	segment*   each: uvarint HOLE, uvarint DATA, then DATA bytes
//
// whose holes and data add up to the file's size exactly. The puller
// writes each data run at its offset and leaves the holes unwritten, so a
// file of a terabyte holding a few bytes costs a few blocks on both nodes
// and a few bytes on the wire. A puller that does not ask gets every file
// whole (a node of an older version).
//
// archive/tar's own sparse formats are not used: it reads them, holes as
// zeros, but cannot write them, and internal/layertar refuses them.

// HolesHeader, set to "1" on a layer request, asks for sparse files as
// holes and data.
const HolesHeader = "Warren-Layer-Holes"

// sparseSizeKey is the PAX record that marks a sparse body and gives the
// file's size.
const sparseSizeKey = "WARREN.sparse.size"

// segment is a run of a sparse file: a hole, then data.
type segment struct{ hole, data int64 }

// fileSegments lists f's data runs (SEEK_DATA and SEEK_HOLE) as
// segments; a hole at the end is a last segment without data.
func fileSegments(f *os.File, size int64) ([]segment, error) {
	var segs []segment
	fd := int(f.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return append(segs, segment{hole: size - off}), nil
		}
		if err != nil {
			return nil, err
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return nil, err
		}
		hole = min(hole, size)
		segs = append(segs, segment{hole: data - off, data: hole - data})
		off = hole
	}
	return segs, nil
}

// appendSegment appends a segment's head (its hole's and data's lengths).
func appendSegment(b []byte, hole, data uint64) []byte {
	return binary.AppendUvarint(binary.AppendUvarint(b, hole), data)
}

// sparseBodyLen is the length of the body of segs.
func sparseBodyLen(segs []segment) int64 {
	var n int64
	for _, s := range segs {
		n += int64(len(appendSegment(nil, uint64(s.hole), uint64(s.data)))) + s.data
	}
	return n
}

// writeSparseBody writes f's segs as a sparse body.
func writeSparseBody(w io.Writer, f *os.File, segs []segment) error {
	var off int64
	var head []byte
	for _, s := range segs {
		head = appendSegment(head[:0], uint64(s.hole), uint64(s.data))
		if _, err := w.Write(head); err != nil {
			return err
		}
		off += s.hole
		if _, err := io.Copy(w, io.NewSectionReader(f, off, s.data)); err != nil {
			return err
		}
		off += s.data
	}
	return nil
}

// sparseTarget is where readSparse writes: a new, empty file.
type sparseTarget interface {
	io.WriterAt
	Truncate(size int64) error
}

// readSparse writes the sparse body in (all of it: anything after the
// last segment is an error) into out, a file of size bytes: data at its
// offsets, holes unwritten, then the size set. Nothing is written past
// size.
func readSparse(in io.Reader, out sparseTarget, size int64) error {
	if size < 0 {
		return fmt.Errorf("imagepeer: sparse file of size %d", size)
	}
	br := bufio.NewReaderSize(in, 64<<10)
	var off int64
	for off < size {
		hole, err1 := binary.ReadUvarint(br)
		data, err2 := binary.ReadUvarint(br)
		if err := errors.Join(err1, err2); err != nil {
			return fmt.Errorf("imagepeer: sparse file cut short at %d of %d bytes: %w", off, size, err)
		}
		left := uint64(size - off)
		if hole+data == 0 || hole > left || data > left-hole {
			return fmt.Errorf("imagepeer: sparse file: a segment of %d+%d bytes at %d of a %d-byte file", hole, data, off, size)
		}
		off += int64(hole)
		if _, err := io.CopyN(io.NewOffsetWriter(out, off), br, int64(data)); err != nil {
			return fmt.Errorf("imagepeer: sparse file cut short at %d of %d bytes: %w", off, size, err)
		}
		off += int64(data)
	}
	if _, err := br.ReadByte(); err == nil {
		return errors.New("imagepeer: sparse file: bytes after its last segment")
	} else if !errors.Is(err, io.EOF) {
		return err
	}
	return out.Truncate(size)
}

// sparseEntry is a layer entry's sparse body: layertar has it fill the
// file it creates (layertar.FileFiller) instead of copying it.
type sparseEntry struct {
	r    io.Reader
	size int64
}

func (e *sparseEntry) Read(p []byte) (int, error) {
	return 0, errors.New("imagepeer: a sparse entry is not read as a stream")
}

func (e *sparseEntry) FillFile(f *os.File) error { return readSparse(e.r, f, e.size) }

// parseSparseSize reads sparseSizeKey's value.
func parseSparseSize(v string) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("imagepeer: bad %s %q", sparseSizeKey, v)
	}
	return n, nil
}
