package oci

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/layertar"
)

// FuzzUnpackLayer feeds tar streams to the layer unpacker, in a data dir
// beside an "outside" dir with a victim file, and checks that nothing was
// written outside the layer: the victim and the outside dir are as they
// were, the data dir holds nothing but the layer (if it was unpacked), and
// the layer has no device node but whiteouts. Without root, chown and
// mknod fail and so do many inputs, early; as root (make test) every path
// runs.
func FuzzUnpackLayer(f *testing.F) {
	for _, seed := range fuzzSeeds(f) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		outside := filepath.Join(base, "outside")
		victim := filepath.Join(outside, "victim")
		if err := os.Mkdir(outside, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(victim, []byte("victim"), 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := image.Open(filepath.Join(base, "data"))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		diffID := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
		id, err := unpackLayer(context.Background(), s, diffID, func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(data)), nil
		}, nil)

		if b, rerr := os.ReadFile(victim); rerr != nil || string(b) != "victim" {
			t.Fatalf("victim changed: %q %v", b, rerr)
		}
		var st fs.FileInfo
		if st, err = os.Lstat(victim); err != nil || !st.Mode().IsRegular() || linkCount(st) != 1 {
			t.Fatalf("victim replaced or linked: %v %v", st, err)
		}
		if names := fuzzNames(t, outside); len(names) != 1 {
			t.Fatalf("written outside: %v", names)
		}
		if names := fuzzNames(t, base); len(names) != 2 {
			t.Fatalf("written beside the data dir: %v", names)
		}
		layers := fuzzNames(t, filepath.Join(s.Dir(), "layers"))
		switch {
		case id == "" && len(layers) != 0:
			t.Fatalf("a failed unpack left %v", layers)
		case id != "" && (len(layers) != 1 || layers[0] != id):
			t.Fatalf("unpacked %s, layers/ holds %v", id, layers)
		}
		for _, d := range []string{"templates", "disks", "sandboxes", "snapshots"} {
			if names := fuzzNames(t, filepath.Join(s.Dir(), d)); len(names) != 0 {
				t.Fatalf("written into %s/: %v", d, names)
			}
		}
		if id != "" {
			l := s.LayerDir(id)
			_ = filepath.WalkDir(l, func(p string, d fs.DirEntry, err error) error {
				if err == nil && d.Type()&fs.ModeDevice != 0 && !layertar.IsWhiteout(p) {
					t.Fatalf("device node %s in the layer", p)
				}
				return nil
			})
		}
	})
}

func linkCount(fi fs.FileInfo) uint64 { return fi.Sys().(*syscall.Stat_t).Nlink }

func fuzzNames(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

// fuzzSeeds are tar streams aiming at the outside dir: the data dir is
// base/data and a layer is unpacked in base/data/layers/<tmp>, so
// "../../../outside" from the layer's root is the outside dir.
func fuzzSeeds(tb testing.TB) [][]byte {
	const out = "../../../outside"
	dev := tarEntry{Header: tar.Header{Name: "dev/sda", Typeflag: tar.TypeBlock, Mode: 0o666, Devmajor: 8}}
	wh := tarEntry{Header: tar.Header{Name: "wh", Typeflag: tar.TypeChar, Mode: 0o666}}
	setuid := tfile("bin/su", "x", 0o4755)
	l1, l2 := unpackLayers(tb)
	return [][]byte{
		l1, l2,
		mkTar(tb, tfile(out+"/pwned", "x", 0o644)),
		mkTar(tb, tdir("a/", 0o755), tfile("a/"+out+"/pwned", "x", 0o644)),
		mkTar(tb, tsymlink("a", out), tfile("a/victim", "x", 0o644)),
		mkTar(tb, tsymlink("a", out), tdir("a/made/", 0o755)),
		mkTar(tb, tsymlink("a", out), tfile("a/.wh.victim", "", 0o644)),
		mkTar(tb, tsymlink("a", out), tfile("a/.wh..wh..opq", "", 0o644)),
		mkTar(tb, tdir("d/", 0o755), tsymlink("d/l", out), tdir("d/l/sub/", 0o755), tfile("d/l/sub/pwned", "x", 0o644)),
		mkTar(tb, thardlink("h", out+"/victim")),
		mkTar(tb, tsymlink("a", out), thardlink("h", "a/victim")),
		mkTar(tb, tdir("a/", 0o755), tfile("a/ok", "x", 0o644), tsymlink("a", out), tfile("a/pwned", "x", 0o644)),
		mkTar(tb, tsymlink("a", "."), tsymlink("a/b", out), tfile("a/b/pwned", "x", 0o644)),
		mkTar(tb, tdir("./", 0o755), dev, wh, setuid, thardlink("dev/sda2", "dev/sda")),
		mkTar(tb, tfile(".wh...", "", 0o644), tfile(".wh.", "", 0o644), tfile("a/.wh../x", "", 0o644)),
	}
}
