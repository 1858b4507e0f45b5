package blobstore_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/warren-sandbox/warren/internal/blobstore"
)

func TestPackKeepsHoles(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	if err := os.MkdirAll(filepath.Join(src, "checkpoint"), 0o700); err != nil {
		t.Fatal(err)
	}
	// A 4 GiB disk image holding two runs of data, and a dense file.
	img, err := os.Create(filepath.Join(src, "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	img.WriteAt(bytes.Repeat([]byte("a"), 8192), 1<<20)
	img.WriteAt(bytes.Repeat([]byte("b"), 4096), 3<<30)
	img.Truncate(4 << 30)
	img.Close()
	if err := os.WriteFile(filepath.Join(src, "checkpoint", "checkpoint.img"), bytes.Repeat([]byte("memory"), 10000), 0o600); err != nil {
		t.Fatal(err)
	}

	var pack bytes.Buffer
	if err := blobstore.Pack(&pack, src); err != nil {
		t.Fatal(err)
	}
	if pack.Len() > 200<<10 {
		t.Fatalf("the pack of 72 KiB of data is %d bytes: holes were sent", pack.Len())
	}
	dst := filepath.Join(t.TempDir(), "dst")
	if err := blobstore.Unpack(bytes.NewReader(pack.Bytes()), dst); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dst, "disk.img"))
	if err != nil || fi.Size() != 4<<30 {
		t.Fatalf("disk.img: %v %v", fi, err)
	}
	if blocks := fi.Sys().(*syscall.Stat_t).Blocks * 512; blocks > 1<<20 {
		t.Fatalf("the unpacked disk image uses %d bytes: holes were filled", blocks)
	}
	f, _ := os.Open(filepath.Join(dst, "disk.img"))
	defer f.Close()
	for _, c := range []struct {
		off  int64
		want byte
	}{{1 << 20, 'a'}, {1<<20 + 8191, 'a'}, {1<<20 + 8192, 0}, {3 << 30, 'b'}, {0, 0}} {
		b := make([]byte, 1)
		f.ReadAt(b, c.off)
		if b[0] != c.want {
			t.Errorf("byte at %d: %q, want %q", c.off, b[0], c.want)
		}
	}
	mem, _ := os.ReadFile(filepath.Join(dst, "checkpoint", "checkpoint.img"))
	if !bytes.Equal(mem, bytes.Repeat([]byte("memory"), 10000)) {
		t.Fatal("checkpoint.img differs")
	}
}

func TestUnpackRefusesBadPacks(t *testing.T) {
	for name, pack := range map[string]string{
		"escape":      "warren-pack 1\nfile ../x 1 600\ndata 0 1\nxend\ndone\n",
		"absolute":    "warren-pack 1\nfile /etc/x 1 600\nend\ndone\n",
		"dotted":      "warren-pack 1\ndir a 700\nfile a/../../x 1 600\nend\ndone\n",
		"outside":     "warren-pack 1\nfile x 4 600\ndata 2 4\nabcdend\ndone\n",
		"cut short":   "warren-pack 1\nfile x 10 600\ndata 0 10\nabc",
		"no magic":    "file x 1 600\nend\ndone\n",
		"no done":     "warren-pack 1\n",
		"bad mode":    "warren-pack 1\nfile x 1 4755\nend\ndone\n",
		"nested file": "warren-pack 1\nfile x 0 600\nend\nfile x/y 0 600\nend\ndone\n",
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			err := blobstore.Unpack(strings.NewReader(pack), filepath.Join(root, "dst"))
			if err == nil {
				t.Fatal("unpacked")
			}
			if _, serr := os.Stat(filepath.Join(root, "x")); serr == nil {
				t.Fatal("wrote outside its directory")
			}
			if !errors.Is(err, blobstore.ErrCorrupt) && name != "nested file" {
				t.Fatalf("not ErrCorrupt: %v", err)
			}
		})
	}
}

func TestPackRefusesLinks(t *testing.T) {
	src := t.TempDir()
	os.Symlink("/etc/passwd", filepath.Join(src, "link"))
	if err := blobstore.Pack(&bytes.Buffer{}, src); err == nil {
		t.Fatal("packed a symbolic link")
	}
}

func TestSecretsAreRedacted(t *testing.T) {
	cfg := blobstore.S3Config{AccessKey: "AKIAEXAMPLE", SecretKey: "very-secret-value", SessionToken: "token-value"}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("config", "blob", cfg, "secret", cfg.SecretKey)
	out := buf.String() + fmt.Sprintf("%v %+v %#v %s", cfg, cfg, cfg, cfg.SecretKey)
	for _, s := range []string{"very-secret-value", "token-value"} {
		if strings.Contains(out, s) {
			t.Fatalf("a credential printed: %s", out)
		}
	}
}
