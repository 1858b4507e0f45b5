package cluster

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestAuthSignsAndChecks(t *testing.T) {
	secret := []byte(strings.Repeat("s", 32))
	a, err := NewAuth(secret)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	a.now = func() time.Time { return now }
	req := func(method, path string) *http.Request { return httptest.NewRequest(method, "http://node"+path, nil) }

	r := req("POST", "/warren.node.v1.NodeService/KillSandbox")
	a.Sign(r)
	if err := a.Check(r); err != nil {
		t.Fatalf("a signed request: %v", err)
	}
	other, _ := NewAuth([]byte(strings.Repeat("t", 32)))
	other.now = a.now
	if err := other.Check(r); err == nil {
		t.Error("another secret's check took the request")
	}

	field := func(r *http.Request, i int) string { return strings.Split(r.Header.Get(AuthHeader), ".")[i] }
	cases := map[string]func(*http.Request){
		"no header":    func(r *http.Request) { r.Header.Del(AuthHeader) },
		"two headers":  func(r *http.Request) { r.Header.Add(AuthHeader, r.Header.Get(AuthHeader)) },
		"other path":   func(r *http.Request) { r.URL.Path = "/warren.node.v1.NodeService/CreateSandbox" },
		"other method": func(r *http.Request) { r.Method = "GET" },
		"no dot":       func(r *http.Request) { r.Header.Set(AuthHeader, "123") },
		"bad time":     func(r *http.Request) { r.Header.Set(AuthHeader, "x."+field(r, 1)+"."+field(r, 2)) },
		"other nonce":  func(r *http.Request) { r.Header.Set(AuthHeader, field(r, 0)+".00."+field(r, 2)) },
		"forged mac": func(r *http.Request) {
			r.Header.Set(AuthHeader, strconv.FormatInt(now.Unix(), 10)+"."+field(r, 1)+"."+strings.Repeat("0", 64))
		},
		"time moved back": func(r *http.Request) { r.Header.Set(AuthHeader, "1"+r.Header.Get(AuthHeader)) },
	}
	for name, spoil := range cases {
		r := req("POST", "/warren.node.v1.NodeService/KillSandbox")
		a.Sign(r)
		spoil(r)
		if err := a.Check(r); err == nil {
			t.Errorf("%s: taken", name)
		}
	}

	// A captured header is good for authSkew only.
	r = req("POST", "/x")
	a.Sign(r)
	now = now.Add(authSkew + time.Second)
	if err := a.Check(r); err == nil {
		t.Error("a header older than the skew was taken")
	}
	now = now.Add(-2*authSkew - 2*time.Second)
	if err := a.Check(r); err == nil {
		t.Error("a header from the future beyond the skew was taken")
	}

	if _, err := NewAuth([]byte("short")); err == nil {
		t.Error("a short secret was taken")
	}
}

func TestRequireServesOnlySignedRequests(t *testing.T) {
	a, _ := NewAuth([]byte(strings.Repeat("k", 40)))
	served := 0
	h := a.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(AuthHeader) != "" {
			t.Error("the header reached the handler")
		}
		served++
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	res, err := http.Get(srv.URL + "/anything")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized || served != 0 {
		t.Fatalf("unsigned: %d, served %d", res.StatusCode, served)
	}
	c := &http.Client{Transport: a.Transport(nil)}
	res, err = c.Get(srv.URL + "/anything")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK || served != 1 || res.Header.Get(AuthHeader) != "" {
		t.Fatalf("signed: %d, served %d, proof passed on: %q", res.StatusCode, served, res.Header.Get(AuthHeader))
	}
}

// The api takes only answers from a holder of the secret: an impostor at
// a node's address, or a node of another cluster, is refused.
func TestTransportChecksTheAnswer(t *testing.T) {
	a, _ := NewAuth([]byte(strings.Repeat("k", 40)))
	other, _ := NewAuth([]byte(strings.Repeat("o", 40)))
	impostor := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(AuthHeader, r.Header.Get(AuthHeader)) // echoes what it got
		w.Write([]byte("trust me"))
	}))
	defer impostor.Close()
	foreign := httptest.NewServer(other.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	defer foreign.Close()
	c := &http.Client{Transport: a.Transport(nil)}
	if _, err := c.Get(impostor.URL + "/x"); err == nil || !strings.Contains(err.Error(), "does not prove") {
		t.Errorf("an impostor's answer: %v", err)
	}
	// Another cluster's node refuses the request itself: its 401 comes back.
	res, err := c.Get(foreign.URL + "/x")
	if err != nil || res.StatusCode != http.StatusUnauthorized {
		t.Errorf("another cluster's node: %v %v", res, err)
	}
	// An answer is bound to its request: replayed, it proves nothing.
	r1 := httptest.NewRequest("GET", "http://node/x", nil)
	a.Sign(r1)
	rec := httptest.NewRecorder()
	a.Require(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(rec, r1)
	r2 := httptest.NewRequest("GET", "http://node/x", nil)
	a.Sign(r2)
	if err := a.CheckAnswer(r2, rec.Result()); err == nil {
		t.Error("an answer to another request was taken")
	}
}
