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

	cases := map[string]func(*http.Request){
		"no header":    func(r *http.Request) { r.Header.Del(AuthHeader) },
		"two headers":  func(r *http.Request) { r.Header.Add(AuthHeader, r.Header.Get(AuthHeader)) },
		"other path":   func(r *http.Request) { r.URL.Path = "/warren.node.v1.NodeService/CreateSandbox" },
		"other method": func(r *http.Request) { r.Method = "GET" },
		"no dot":       func(r *http.Request) { r.Header.Set(AuthHeader, "123") },
		"bad time":     func(r *http.Request) { r.Header.Set(AuthHeader, "x."+strings.Split(r.Header.Get(AuthHeader), ".")[1]) },
		"forged mac": func(r *http.Request) {
			r.Header.Set(AuthHeader, strconv.FormatInt(now.Unix(), 10)+"."+strings.Repeat("0", 64))
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
	if res.StatusCode != http.StatusOK || served != 1 {
		t.Fatalf("signed: %d, served %d", res.StatusCode, served)
	}
}
