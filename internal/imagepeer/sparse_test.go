package imagepeer

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// A sparse file in a layer (a build step's `truncate -s 1G`) arrives as
// sparse as it left: its holes travel as lengths and are left unwritten.
func TestPullKeepsALayersHoles(t *testing.T) {
	testenv.NeedRoot(t)
	from, _ := image.Open(t.TempDir())
	to, _ := image.Open(t.TempDir())
	builtLayer(t, from, "l1")
	const apparent = 1 << 30
	p := filepath.Join(from.LayerDir("l1"), "var/sparse.img")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(apparent)
	f.WriteAt([]byte("head"), 0)
	f.WriteAt([]byte("middle"), apparent/2)
	f.Close()
	os.Chmod(p, 0o644)
	from.PutTemplate(&image.Template{ID: "b1", Layers: []string{"l1"}})
	srv := httptest.NewServer(Handler(from))
	defer srv.Close()
	if err := pullerFrom(srv, to).Pull(context.Background(), "builder", "b1"); err != nil {
		t.Fatal(err)
	}
	got, err := os.Open(filepath.Join(to.LayerDir("l1"), "var/sparse.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	var st unix.Stat_t
	unix.Fstat(int(got.Fd()), &st)
	head, mid := make([]byte, 4), make([]byte, 6)
	got.ReadAt(head, 0)
	got.ReadAt(mid, apparent/2)
	if st.Size != apparent || string(head) != "head" || string(mid) != "middle" || st.Mode&0o7777 != 0o644 {
		t.Errorf("sparse.img: %d bytes, %q, %q, mode %o", st.Size, head, mid, st.Mode&0o7777)
	}
	if st.Blocks*512 > 1<<20 {
		t.Errorf("sparse.img takes %d bytes on the puller: its holes were written", st.Blocks*512)
	}
	// The rest of the layer is as before.
	if b, _ := os.ReadFile(filepath.Join(to.LayerDir("l1"), "etc/app/conf")); string(b) != "key=value\n" {
		t.Errorf("conf holds %q", b)
	}
}

// The space guard is asked while a layer is written, not only before:
// once it refuses, the pull stops and its partial layer is removed.
func TestPullStopsWhenTheSpaceGuardRefuses(t *testing.T) {
	testenv.NeedRoot(t)
	for _, kind := range []string{"layer", "checkpoint"} {
		t.Run(kind, func(t *testing.T) {
			from, _ := image.Open(t.TempDir())
			to, _ := image.Open(t.TempDir())
			builtLayer(t, from, "l1")
			big := make([]byte, 64<<20)
			rand.Read(big)
			tmpl := &image.Template{ID: "b1", Layers: []string{"l1"}}
			if kind == "layer" {
				os.WriteFile(filepath.Join(from.LayerDir("l1"), "big"), big, 0o600)
			} else {
				sd := from.SnapshotDir("s1")
				os.MkdirAll(sd, 0o700)
				os.WriteFile(filepath.Join(sd, "checkpoint.img"), big, 0o600)
				tmpl.Snapshot = "s1"
			}
			from.PutTemplate(tmpl)
			calls := 0
			full := errors.New("the data dir's file system is below its reserve")
			to.GuardSpace(func() error {
				if calls++; calls > 2 {
					return full
				}
				return nil
			})
			srv := httptest.NewServer(Handler(from))
			defer srv.Close()
			err := pullerFrom(srv, to).Pull(context.Background(), "builder", "b1")
			if !errors.Is(err, full) {
				t.Fatalf("pull with a guard that refuses after 2 calls: %v", err)
			}
			if to.HasLayer("l1") && kind == "layer" || to.HasSnapshot("s1") {
				t.Error("the partial pull was kept")
			}
			for _, sub := range []string{"layers", "snapshots"} {
				left, _ := filepath.Glob(filepath.Join(to.Dir(), sub, image.PullTempPrefix+"*"))
				if len(left) > 0 {
					t.Errorf("left behind: %v", left)
				}
			}
			if _, err := to.Template("b1"); err == nil {
				t.Error("the record was written")
			}
		})
	}
}

// The sparse body decoder takes only what fits the declared size.
func TestReadSparseRefusesABadBody(t *testing.T) {
	seg := func(hole, data uint64, payload string) []byte {
		return append(appendSegment(nil, hole, data), payload...)
	}
	for name, c := range map[string]struct {
		body []byte
		size int64
	}{
		"past its size":     {seg(0, 5, "abcde"), 3},
		"a hole past":       {seg(4, 0, ""), 3},
		"an empty segment":  {seg(0, 0, ""), 3},
		"cut short":         {seg(0, 3, "ab"), 3},
		"short of its size": {seg(0, 2, "ab"), 3},
		"trailing bytes":    {append(seg(1, 2, "ab"), 'x'), 3},
		"a bad varint":      {bytes.Repeat([]byte{0xff}, 11), 3},
		"a huge hole":       {seg(1<<63, 0, ""), 3},
	} {
		out := &memTarget{}
		if err := readSparse(bytes.NewReader(c.body), out, c.size); err == nil {
			t.Errorf("%s: taken", name)
		}
		if out.max > c.size {
			t.Errorf("%s: wrote up to %d in a %d-byte file", name, out.max, c.size)
		}
	}
	out := &memTarget{}
	body := append(seg(2, 3, "abc"), seg(4, 0, "")...)
	if err := readSparse(bytes.NewReader(body), out, 9); err != nil || out.size != 9 || !strings.Contains(string(out.data[:out.max]), "abc") {
		t.Errorf("a sound body: %v, size %d", err, out.size)
	}
}

// memTarget is a sparse file in memory: what was written where.
type memTarget struct {
	data      []byte
	max, size int64
}

func (m *memTarget) WriteAt(p []byte, off int64) (int, error) {
	end := off + int64(len(p))
	if end > m.max {
		m.max = end
	}
	if end <= 1<<20 {
		if int64(len(m.data)) < end {
			m.data = append(m.data, make([]byte, end-int64(len(m.data)))...)
		}
		copy(m.data[off:], p)
	}
	return len(p), nil
}

func (m *memTarget) Truncate(size int64) error { m.size = size; return nil }

func FuzzReadSparse(f *testing.F) {
	f.Add(append(appendSegment(nil, 2, 3), "abc"...), int64(5))
	f.Add(appendSegment(nil, 0, 0), int64(0))
	f.Add([]byte{}, int64(0))
	f.Add(bytes.Repeat([]byte{0x80}, 12), int64(1<<40))
	f.Fuzz(func(t *testing.T, body []byte, size int64) {
		out := &memTarget{}
		err := readSparse(bytes.NewReader(body), out, size)
		if out.max > size && size >= 0 {
			t.Fatalf("wrote up to %d in a %d-byte file", out.max, size)
		}
		if err == nil && (size < 0 || out.size != size) {
			t.Fatalf("taken with size %d, truncated to %d", size, out.size)
		}
	})
}
