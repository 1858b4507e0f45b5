package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/imagepeer"
	"github.com/warren-sandbox/warren/internal/templateclient"
)

// TestTamperedLayerStream: a man in the middle in front of the node that
// built a template (so that the other node's pull of its layers goes
// through it) changes the layer's tar stream: a file of the layer gets
// other bytes of the same length (the tar stays well formed), as is, with
// the unsigned Warren-Layer-Digest trailer made to match, and with the
// cluster's body proof dropped too. Each time the pulling node refuses
// the stream: no sandbox runs from the changed bytes, nothing of the
// layer is left on its disk, the other sandboxes still work. A last
// create, through the same man in the middle passing the stream as it
// came, runs and reads the layer's file back: the pull path the attack
// took is the one a sandbox is made from.
func TestTamperedLayerStream(t *testing.T) {
	ctx := context.Background()
	marker := "warren-layer-marker-" + randHex(12)
	forged := "warren-layer-FORGED-" + randHex(12) // same length: the tar's headers stay right
	const markerPath = "/etc/warren-layer-marker"
	built, err := templateclient.New(C.apis[0].apiURL, C.teamA.key).Build(ctx, templateclient.BuildOptions{
		Name:       "sec-layer-" + randHex(4),
		Dockerfile: "FROM base\nRUN echo " + marker + " > " + markerPath + "\n",
	})
	if err != nil {
		t.Fatalf("building the template: %v", err)
	}
	defer C.call(context.Background(), C.teamA, "DELETE", "/templates/"+built.TemplateID, nil)
	bd, err := C.st.GetBuild(ctx, built.BuildID)
	if err != nil {
		t.Fatal(err)
	}
	var builder, puller *proc
	for _, n := range C.nodes {
		if n.name == bd.Node {
			builder = n
		} else {
			puller = n
		}
	}
	if builder == nil || puller == nil {
		t.Fatalf("the build ran on %q, not on one of the suite's nodes", bd.Node)
	}
	pulled := layersToPull(t, builder, puller, built.BuildID)
	t.Logf("built %s on %s; %s must pull layers %v", built.BuildID, builder.name, puller.name, pulled)

	// Another team's sandbox on the pulling node, with a file of its own.
	witness, err := C.createOn(ctx, puller.name, C.teamB, 600)
	if err != nil {
		t.Fatal(err)
	}
	defer C.call(context.Background(), C.teamB, "DELETE", "/sandboxes/"+witness.ID, nil)
	if r, err := C.exec(ctx, witness, "echo witness-data > /home/user/w"); err != nil || r.exit != 0 {
		t.Fatalf("the witness: %v %+v", err, r)
	}
	before := C.snapshot(t)

	mitm := throughProxy(t, builder)
	isLayer := func(res *http.Response) bool { return res.Header.Get("Content-Type") == "application/x-tar" }
	for _, c := range []struct {
		name string
		// after changes the answer once its body is b (its trailers are
		// read by then).
		after func(res *http.Response, b []byte)
	}{
		{"bytes changed", func(*http.Response, []byte) {}},
		{"bytes changed, the layer digest recomputed", recomputeLayerDigest},
		{"bytes changed, the layer digest recomputed, the body proof dropped", func(res *http.Response, b []byte) {
			recomputeLayerDigest(res, b)
			for k := range res.Trailer {
				if k != imagepeer.DigestTrailer {
					delete(res.Trailer, k)
				}
			}
		}},
	} {
		var changed atomic.Int32
		mitm.setRewriteOf(isLayer, func(res *http.Response, body []byte) []byte {
			if !bytes.Contains(body, []byte(marker)) {
				return body
			}
			changed.Add(1)
			body = bytes.ReplaceAll(body, []byte(marker), []byte(forged))
			c.after(res, body)
			return body
		})
		r, err := C.createOf(ctx, built.TemplateID, puller.name, C.teamA, 120)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if changed.Load() == 0 {
			t.Fatalf("%s: no layer holding the template's file passed the man in the middle (the create answered %s)", c.name, r)
		}
		t.Logf("%s: the create answered %s", c.name, r)
		taken := r.status == http.StatusCreated
		if taken {
			sb, rec, err := C.created(ctx, r, C.teamA)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			out, err := C.exec(ctx, sb, "cat "+markerPath)
			t.Errorf("%s: the pull was taken: sandbox %s runs on %s, its %s reads %q (%v)", c.name, sb.ID, rec.Node, markerPath, out.stdout, err)
			C.call(ctx, C.teamA, "DELETE", "/sandboxes/"+sb.ID, nil)
		} else {
			checkErrorBody(t, c.name, r)
		}
		if left := pullLeftovers(builder, puller, pulled, built.BuildID, []byte(forged)); len(left) > 0 {
			t.Errorf("%s: %s kept what the pull wrote: %v", c.name, puller.name, left)
		}
		if taken {
			t.Fatalf("%s has the image now: the cases after %q would not pull it", puller.name, c.name)
		}
	}

	// The control: the stream passes the same man in the middle as it
	// came; the sandbox reads the layer's file.
	var passed atomic.Int32
	mitm.setRewriteOf(isLayer, func(_ *http.Response, body []byte) []byte {
		if bytes.Contains(body, []byte(marker)) {
			passed.Add(1)
		}
		return body
	})
	r, err := C.createOf(ctx, built.TemplateID, puller.name, C.teamA, 120)
	mitm.setRewrite(nil)
	if err != nil || r.status != http.StatusCreated {
		t.Fatalf("the control: a create through the man in the middle passing the stream unchanged: %v %s", err, r)
	}
	sb, rec, err := C.created(ctx, r, C.teamA)
	if err != nil {
		t.Fatal(err)
	}
	defer C.call(context.Background(), C.teamA, "DELETE", "/sandboxes/"+sb.ID, nil)
	if rec.Node != puller.name || passed.Load() == 0 {
		t.Fatalf("the control: sandbox %s is on %s, %d layer streams with the file passed the man in the middle; want %s and some",
			sb.ID, rec.Node, passed.Load(), puller.name)
	}
	if out, err := C.exec(ctx, sb, "cat "+markerPath); err != nil || strings.TrimSpace(out.stdout) != marker {
		t.Errorf("the control: %s reads %q (%v), want %q", markerPath, out.stdout, err, marker)
	}
	// The layers are where the refused pulls were looked for, as the
	// builder has them.
	for _, l := range pulled {
		if diff := sameTree(filepath.Join(builder.dataDir, "layers", l), filepath.Join(puller.dataDir, "layers", l), []byte(forged)); diff != "" {
			t.Errorf("the control: layer %s on %s: %s", l, puller.name, diff)
		}
	}
	if res, err := C.call(ctx, C.teamA, "DELETE", "/sandboxes/"+sb.ID, nil); err != nil || res.status != http.StatusNoContent {
		t.Errorf("killing the control's sandbox: %v %s", err, res)
	}

	if r, err := C.exec(ctx, witness, "cat /home/user/w"); err != nil || strings.TrimSpace(r.stdout) != "witness-data" {
		t.Errorf("the witness on %s no longer reads its file: %v %+v", puller.name, err, r)
	}
	C.untouched(t, before)
}

// recomputeLayerDigest sets the unsigned Warren-Layer-Digest trailer to
// the changed body's SHA-256, as an attacker can.
func recomputeLayerDigest(res *http.Response, b []byte) {
	sum := sha256.Sum256(b)
	if res.Trailer == nil {
		res.Trailer = http.Header{}
	}
	res.Trailer.Set(imagepeer.DigestTrailer, hex.EncodeToString(sum[:]))
}

// layersToPull are the layers of image id (on builder) that puller has
// not got.
func layersToPull(t *testing.T, builder, puller *proc, id string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(builder.dataDir, "templates", id+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var img image.Template
	if err := json.Unmarshal(b, &img); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range img.Layers {
		if _, err := os.Lstat(filepath.Join(puller.dataDir, "layers", l)); err != nil {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s already has every layer of %s (%v): nothing to pull", puller.name, id, img.Layers)
	}
	return out
}

// pullLeftovers lists what of a refused pull of image id is in p's image
// store: its record, temporary dirs of pulls, and layers that are not
// the builder's own, byte for byte, or hold forged. (A layer pulled
// whole before the changed one is kept, as the image store keeps any.)
func pullLeftovers(builder, p *proc, layers []string, id string, forged []byte) []string {
	var left []string
	for _, l := range layers {
		dir := filepath.Join(p.dataDir, "layers", l)
		if _, err := os.Lstat(dir); err != nil {
			continue
		}
		if diff := sameTree(filepath.Join(builder.dataDir, "layers", l), dir, forged); diff != "" {
			left = append(left, "layers/"+l+": "+diff)
		}
	}
	if _, err := os.Lstat(filepath.Join(p.dataDir, "templates", id+".json")); err == nil {
		left = append(left, "templates/"+id+".json")
	}
	for _, d := range []string{"layers", "snapshots"} {
		m, _ := filepath.Glob(filepath.Join(p.dataDir, d, image.PullTempPrefix+"*"))
		for _, x := range m {
			left = append(left, d+"/"+filepath.Base(x))
		}
	}
	return left
}

// sameTree says how the tree at got differs from the one at want (type,
// permissions, a file's bytes, a link's target, a device's number), or
// whether a file of it holds forged; "" if in none.
func sameTree(want, got string, forged []byte) string {
	var diffs []string
	seen := map[string]bool{}
	filepath.WalkDir(want, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			diffs = append(diffs, err.Error())
			return nil
		}
		rel, _ := filepath.Rel(want, p)
		seen[rel] = true
		if d := sameEntry(p, filepath.Join(got, rel), forged); d != "" {
			diffs = append(diffs, rel+": "+d)
		}
		return nil
	})
	filepath.WalkDir(got, func(p string, _ fs.DirEntry, err error) error {
		if rel, _ := filepath.Rel(got, p); err == nil && !seen[rel] {
			diffs = append(diffs, rel+": not in the builder's layer")
		}
		return nil
	})
	if len(diffs) > 5 {
		diffs = append(diffs[:5], fmt.Sprintf("and %d more", len(diffs)-5))
	}
	return strings.Join(diffs, "; ")
}

func sameEntry(want, got string, forged []byte) string {
	a, err := os.Lstat(want)
	if err != nil {
		return err.Error()
	}
	b, err := os.Lstat(got)
	if err != nil {
		return err.Error()
	}
	if a.Mode() != b.Mode() {
		return fmt.Sprintf("mode %v, the builder's %v", b.Mode(), a.Mode())
	}
	switch {
	case a.Mode().IsRegular():
		wb, err1 := os.ReadFile(want)
		gb, err2 := os.ReadFile(got)
		if err := errors.Join(err1, err2); err != nil {
			return err.Error()
		}
		if bytes.Contains(gb, forged) {
			return "holds the forged bytes"
		}
		if !bytes.Equal(wb, gb) {
			return "other bytes than the builder's"
		}
	case a.Mode()&fs.ModeSymlink != 0:
		wl, _ := os.Readlink(want)
		gl, _ := os.Readlink(got)
		if wl != gl {
			return fmt.Sprintf("links to %q, the builder's to %q", gl, wl)
		}
	case a.Mode()&fs.ModeDevice != 0:
		if a.Sys().(*syscall.Stat_t).Rdev != b.Sys().(*syscall.Stat_t).Rdev {
			return "another device number"
		}
	}
	return ""
}

// checkErrorBody fails the test unless r is an error in E2B's
// {"code","message"} shape.
func checkErrorBody(t *testing.T, name string, r response) {
	t.Helper()
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if r.status < 400 || json.Unmarshal(r.body, &e) != nil || e.Code != r.status || e.Message == "" {
		t.Errorf("%s: the create answered %s, want an error with its code and message", name, r)
	}
}
