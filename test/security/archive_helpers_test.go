package security

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// entry is one hand-made tar entry: Type is a tar type flag; Body the
// content of a regular file; Link a symlink's or hard link's target.
type entry struct {
	Name     string
	Type     byte
	Mode     int64
	Body     []byte
	Link     string
	Devmajor int64
	Devminor int64
}

func dir(name string) entry { return entry{Name: name, Type: tar.TypeDir, Mode: 0o755} }
func file(name, body string) entry {
	return entry{Name: name, Type: tar.TypeReg, Mode: 0o644, Body: []byte(body)}
}
func symlink(name, target string) entry {
	return entry{Name: name, Type: tar.TypeSymlink, Mode: 0o777, Link: target}
}

// tarOf writes entries as an uncompressed tar, in order, as given: no
// name is cleaned.
func tarOf(t *testing.T, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.Name, Typeflag: e.Type, Mode: e.Mode, Linkname: e.Link,
			Devmajor: e.Devmajor, Devminor: e.Devminor, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if e.Type == tar.TypeReg {
			hdr.Size = int64(len(e.Body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("tar entry %q: %v", e.Name, err)
		}
		if e.Type == tar.TypeReg {
			tw.Write(e.Body)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// sdkFilesHash is the SDK's filesHash of a COPY step (sha256 over "COPY
// src dest" and each entry's path, st_mode, size and content or link
// target), computed over the entries of a hand-made archive, so that a
// server checking the hash against the archive accepts it.
func sdkFilesHash(src, dest string, entries []entry) string {
	h := sha256.New()
	io.WriteString(h, "COPY "+src+" "+dest)
	for _, e := range entries {
		io.WriteString(h, strings.TrimSuffix(e.Name, "/"))
		mode := e.Mode & 0o7777
		size := int64(0)
		switch e.Type {
		case tar.TypeDir:
			mode |= 0o040000
		case tar.TypeSymlink:
			mode |= 0o120000
			size = int64(len(e.Link))
		case tar.TypeChar:
			mode |= 0o020000
		case tar.TypeBlock:
			mode |= 0o060000
		case tar.TypeFifo:
			mode |= 0o010000
		default:
			mode |= 0o100000
			size = int64(len(e.Body))
		}
		io.WriteString(h, strconv.FormatInt(mode, 10))
		io.WriteString(h, strconv.FormatInt(size, 10))
		switch e.Type {
		case tar.TypeSymlink:
			io.WriteString(h, e.Link)
		case tar.TypeReg:
			h.Write(e.Body)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// ociArchive writes an OCI image layout, as a tar, of one image whose
// layers are the given uncompressed layer tars.
func ociArchive(t *testing.T, user string, layers ...[]byte) []byte {
	t.Helper()
	type desc struct {
		MediaType string `json:"mediaType"`
		Digest    string `json:"digest"`
		Size      int    `json:"size"`
	}
	digest := func(b []byte) string { s := sha256.Sum256(b); return "sha256:" + hex.EncodeToString(s[:]) }
	blobs := map[string][]byte{}
	var layerDescs []desc
	var diffIDs []string
	for _, l := range layers {
		d := digest(l)
		blobs[d] = l
		diffIDs = append(diffIDs, d)
		layerDescs = append(layerDescs, desc{"application/vnd.oci.image.layer.v1.tar", d, len(l)})
	}
	cfg, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"User": user, "WorkingDir": "/", "Env": []string{"PATH=/bin:/usr/bin"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": diffIDs},
	})
	blobs[digest(cfg)] = cfg
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": desc{"application/vnd.oci.image.config.v1+json", digest(cfg), len(cfg)},
		"layers": layerDescs,
	})
	blobs[digest(manifest)] = manifest
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
		"manifests": []desc{{"application/vnd.oci.image.manifest.v1+json", digest(manifest), len(manifest)}},
	})
	entries := []entry{
		file("oci-layout", `{"imageLayoutVersion":"1.0.0"}`),
		file("index.json", string(index)),
		dir("blobs/"), dir("blobs/sha256/"),
	}
	for d, b := range blobs {
		entries = append(entries, entry{Name: "blobs/sha256/" + strings.TrimPrefix(d, "sha256:"), Type: tar.TypeReg, Mode: 0o644, Body: b})
	}
	return tarOf(t, entries)
}

// busyboxLayer is a minimal bootable root filesystem: static busybox as
// /bin/sh and a few tools, root and user accounts, /tmp, homes. envd is
// static and mounted by the runtime, so this is enough for a sandbox.
func busyboxLayer(t *testing.T) []entry {
	t.Helper()
	bb, err := os.ReadFile("/usr/bin/busybox")
	if err != nil {
		t.Fatalf("busybox-static is needed for the minimal images: %v", err)
	}
	es := []entry{
		dir("bin/"), dir("etc/"), dir("home/"), {Name: "home/user/", Type: tar.TypeDir, Mode: 0o755}, dir("root/"),
		{Name: "tmp/", Type: tar.TypeDir, Mode: 0o1777}, dir("usr/"), dir("usr/bin/"), dir("opt/"),
		{Name: "bin/busybox", Type: tar.TypeReg, Mode: 0o755, Body: bb},
		file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n"),
		file("etc/group", "root:x:0:\nuser:x:1000:\n"),
	}
	for _, applet := range []string{"sh", "cat", "ls", "id", "hostname", "mkdir", "rm", "ln", "grep", "true", "echo", "test", "[", "sleep", "head", "wc", "stat", "readlink", "env", "chown", "chmod", "cp", "mv", "touch", "find", "mktemp", "tar", "dirname", "basename", "fallocate", "dd", "ps", "kill"} {
		es = append(es, symlink("bin/"+applet, "busybox"))
	}
	return es
}

// importImage imports an OCI archive as name with `warren image import`
// into the server's data dir (the operator's command; the same unpacker
// serves registry pulls). It returns the command's output and error.
func importImage(t *testing.T, name string, archive []byte) (string, error) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "image.tar")
	if err := os.WriteFile(p, archive, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(S.warren, "image", "import", "--data-dir", S.srv.dataDir, name, p).CombinedOutput()
	return string(out), err
}
