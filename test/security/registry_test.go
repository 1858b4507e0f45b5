package security

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// serveRegistry runs an in-memory plain-HTTP registry on ln and pushes a
// minimal image to it; it returns the image's reference.
func serveRegistry(t *testing.T, ln net.Listener) string {
	t.Helper()
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0)))}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	layerTar := tarOf(t, busyboxLayer(t))
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerTar)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.Config(img, v1.Config{User: "root", WorkingDir: "/", Env: []string{"PATH=/bin"}}); err != nil {
		t.Fatal(err)
	}
	ref := ln.Addr().String() + "/sec/pulled:1"
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatalf("pushing to the test registry %s: %v", ref, err)
	}
	return ref
}

// pull builds a template from ref (the SDK's fromImage) and returns the
// build.
func pull(t *testing.T, name, ref string) built {
	t.Helper()
	rb, r := newRawBuild(t, S.teamA, name, nil)
	if rb == nil {
		t.Fatalf("POST /v3/templates: %s", r)
	}
	r, err := S.srv.call(t.Context(), S.teamA, "POST", "/v2/templates/"+rb.TemplateID+"/builds/"+rb.BuildID,
		map[string]any{"fromImage": ref, "steps": []step{}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != http.StatusAccepted {
		checkErrorBody(t, r)
		return built{Err: &statusError{r}}
	}
	return rb.wait(t)
}

// The host pulls template bases; a tenant must not make it fetch over
// plain HTTP from loopback or private addresses (the node's own services,
// the operator's network) unless the operator allowed that registry.
func TestRegistryPullFromLoopbackOrPrivate(t *testing.T) {
	afterCase(t)
	t.Run("control: a registry allowed with --allow-insecure-registry", func(t *testing.T) {
		requireFlag(t, "allow-insecure-registry", "pulls from loopback and private registries over plain HTTP")
		ln, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", S.allowedRegistry))
		if err != nil {
			t.Fatal(err)
		}
		b := pull(t, "sec-pull-allowed", serveRegistry(t, ln))
		if b.Err != nil {
			t.Fatalf("a pull from the allowed registry failed: %v\n%s", b.Err, b.log())
		}
	})
	t.Run("loopback", func(t *testing.T) {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		if b := pull(t, "sec-pull-loopback", serveRegistry(t, ln)); b.Err == nil {
			t.Errorf("the host pulled a template's base from a loopback registry over plain HTTP")
		} else {
			t.Logf("refused: %v", b.Err)
		}
	})
	t.Run("private range", func(t *testing.T) {
		ln, err := S.hosts.priv.ListenTCP(5000)
		if err != nil {
			t.Fatal(err)
		}
		ref := serveRegistry(t, ln)
		if !strings.HasPrefix(ref, privHostAddr+":") {
			t.Fatalf("the registry is at %s", ref)
		}
		if b := pull(t, "sec-pull-private", ref); b.Err == nil {
			t.Errorf("the host pulled a template's base from a private-range registry over plain HTTP")
		} else {
			t.Logf("refused: %v", b.Err)
		}
	})
}
