package imagepeer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/cluster"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// A man in the middle who changes a layer and fixes its digest trailer
// to match is caught: the node signs its answer, and the puller's
// transport checks the body at its end.
func TestPullRefusesALayerChangedOnTheWay(t *testing.T) {
	testenv.NeedRoot(t)
	from, _ := image.Open(t.TempDir())
	to, _ := image.Open(t.TempDir())
	builtLayer(t, from, "l1")
	from.PutTemplate(&image.Template{ID: "b1", Layers: []string{"l1"}})
	auth, err := cluster.NewAuth([]byte(strings.Repeat("i", 32)))
	if err != nil {
		t.Fatal(err)
	}
	// The node's internal address, as noderpc serves it: images only.
	srv := httptest.NewServer(auth.Guard("builder").Serve(Handler(from)))
	defer srv.Close()
	changed := 0
	mitm := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		res, err := http.DefaultTransport.RoundTrip(r)
		if err != nil || !strings.Contains(r.URL.Path, "/layers/") {
			return res, err
		}
		b, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			return nil, err
		}
		if i := bytes.Index(b, []byte("key=value")); i >= 0 {
			copy(b[i:], "key=EVIL!")
			changed++
		}
		sum := sha256.Sum256(b)
		res.Trailer.Set(DigestTrailer, hex.EncodeToString(sum[:]))
		res.Body = io.NopCloser(bytes.NewReader(b))
		return res, nil
	})
	p := &Puller{Images: to, Transport: auth.Transport(mitm),
		Addr: func(context.Context, string) (string, error) { return strings.TrimPrefix(srv.URL, "http://"), nil }}
	if err := p.Pull(context.Background(), "builder", "b1"); err == nil || changed == 0 || !strings.Contains(err.Error(), "does not match its sender's proof") {
		t.Fatalf("a changed layer (%d changes): %v", changed, err)
	}
	if to.HasLayer("l1") {
		t.Error("the changed layer was kept")
	}
	// Unchanged, the same pull goes through.
	p.Transport = auth.Transport(nil)
	if err := p.Pull(context.Background(), "builder", "b1"); err != nil || !to.HasLayer("l1") {
		t.Fatalf("a signed pull: %v", err)
	}
	// Another node's name: refused.
	if err := p.Pull(context.Background(), "other", "b2"); err == nil {
		t.Error("a pull signed for another node was served")
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
