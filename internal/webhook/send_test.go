package webhook

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestSignIsE2Bs checks Sign against vectors made with openssl, E2B's
// recipe: base64 (standard alphabet, "=" stripped) of SHA-256(secret ‖ body).
//
//	echo -n 'a{"a":1}' | openssl dgst -sha256 -binary | base64 | tr -d '='
func TestSignIsE2Bs(t *testing.T) {
	for secret, want := range map[string]string{
		"a":      "S2tQXfhZMUEynz9XK+Vxmd9+iOb0rmfJOpD6jiWzHGY",
		"b":      "kiOhqQGwa+4cPE9mcn7dBK4i6fAwqU0j2Y9yBJ++BkI",
		"s3cret": "C1dnfGQq5NGZc3ZF8BzKAkVeC2HPuRR25raIBIzxvIM",
	} {
		if got := Sign(secret, []byte(`{"a":1}`)); got != want {
			t.Errorf("Sign(%q) = %s, want %s", secret, got, want)
		}
	}
}

func TestGuardPermits(t *testing.T) {
	g := &Guard{}
	for addr, want := range map[string]bool{
		"8.8.8.8": true, "1.1.1.1": true, "2606:4700::1111": true,
		"127.0.0.1": false, "127.8.9.10": false, "::1": false, "10.1.2.3": false, "172.16.0.1": false,
		"192.168.1.1": false, "169.254.169.254": false, "fd00:ec2::254": false, "fe80::1": false,
		"100.64.0.1": false, "0.0.0.0": false, "::": false, "::ffff:127.0.0.1": false, "::ffff:10.0.0.1": false,
		"64:ff9b::a9fe:a9fe": false, "2002:a9fe:a9fe::": false, "224.0.0.1": false, "255.255.255.255": false,
		"198.18.0.1": false, "fe80::1%eth0": false,
	} {
		if got := g.Permits(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Permits(%s) = %v, want %v", addr, got, want)
		}
	}
	allow := &Guard{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	if !allow.Permits(netip.MustParseAddr("127.0.0.1")) || !allow.Permits(netip.MustParseAddr("::ffff:127.0.0.1")) {
		t.Error("an allowed range is refused")
	}
	if allow.Permits(netip.MustParseAddr("10.0.0.1")) || allow.Permits(netip.MustParseAddr("169.254.169.254")) {
		t.Error("allowing loopback allowed more")
	}
}

func TestCheckURLRefusesHostileURLs(t *testing.T) {
	g := &Guard{}
	for _, u := range []string{
		"", "ftp://example.com/", "example.com/hook", "http://", "http://user:pw@example.com/",
		"http://169.254.169.254/latest/meta-data/", "http://10.0.0.8/", "http://[::1]:8080/", "http://127.0.0.1/",
		"http://[::ffff:169.254.169.254]/", "http://localhost/", "http://LOCALHOST./", "http://app.localhost:3000/",
		"http://example.com:99999/", "http://example.com/#frag", "https://" + strings.Repeat("a", MaxURLLength) + ".com/",
	} {
		if _, err := g.CheckURL(u); !errors.Is(err, ErrRefused) {
			t.Errorf("CheckURL(%q) = %v, want refused", u, err)
		}
	}
	for _, u := range []string{"https://example.com/hook", "http://hooks.example.com:8080/x?y=1", "https://8.8.8.8/"} {
		if _, err := g.CheckURL(u); err != nil {
			t.Errorf("CheckURL(%q) = %v", u, err)
		}
	}
	loop := &Guard{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	if _, err := loop.CheckURL("http://localhost:1234/"); err != nil {
		t.Errorf("localhost with loopback allowed: %v", err)
	}
}

// fakeResolver answers names from a map, counting lookups.
type fakeResolver struct {
	names   map[string][]netip.Addr
	lookups atomic.Int32
}

func (r *fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.lookups.Add(1)
	if a, ok := r.names[host]; ok {
		return a, nil
	}
	return nil, errors.New("no such host")
}

// receiver is a loopback endpoint counting the requests it gets.
type receiver struct {
	*httptest.Server
	hits atomic.Int32
}

func newReceiver(t *testing.T, h http.HandlerFunc) *receiver {
	r := &receiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.hits.Add(1)
		h(w, req)
	}))
	t.Cleanup(r.Close)
	return r
}

func ok(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }

// TestSendReachesNothingInternal: addresses and names of this host are
// refused before a connection is made, unless allowed, whatever the URL
// passed at creation (a DNS name that resolves to loopback included).
func TestSendReachesNothingInternal(t *testing.T) {
	rcv := newReceiver(t, ok)
	port := rcv.URL[strings.LastIndex(rcv.URL, ":")+1:]
	res := &fakeResolver{names: map[string][]netip.Addr{
		"rebind.test":     {netip.MustParseAddr("127.0.0.1")},
		"mixed.test":      {netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("127.0.0.1")},
		"metadata.test":   {netip.MustParseAddr("169.254.169.254")},
		"mapped.test":     {netip.MustParseAddr("::ffff:127.0.0.1")},
		"localhost":       {netip.MustParseAddr("127.0.0.1")},
		"app.localhost":   {netip.MustParseAddr("127.0.0.1")},
		"private.example": {netip.MustParseAddr("10.0.0.1")},
	}}
	s := &Sender{Guard: &Guard{}, Resolver: res, Timeout: 2 * time.Second}
	for _, host := range []string{"127.0.0.1", "[::ffff:127.0.0.1]", "rebind.test", "mixed.test", "metadata.test", "mapped.test",
		"localhost", "app.localhost", "private.example", "169.254.169.254", "10.0.0.1"} {
		a := s.Send(context.Background(), "wh", "http://"+host+":"+port+"/hook", "secret", []byte(`{}`))
		if !errors.Is(a.Err, ErrRefused) {
			t.Errorf("%s: %v, want refused", host, a.Err)
		}
	}
	if n := rcv.hits.Load(); n != 0 {
		t.Fatalf("the loopback receiver was reached %d times", n)
	}
	// Allowed, the same names reach it.
	s.Guard = &Guard{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	if a := s.Send(context.Background(), "wh", "http://rebind.test:"+port+"/hook", "secret", []byte(`{}`)); a.Err != nil || a.Status != http.StatusNoContent {
		t.Errorf("allowed: %+v", a)
	}
}

// TestSendResolvesOnce: the address checked is the address dialled (one
// lookup per attempt, pinned), so a name that changes its answer between
// check and connect (DNS rebinding) cannot slip through.
func TestSendResolvesOnce(t *testing.T) {
	rcv := newReceiver(t, ok)
	port := rcv.URL[strings.LastIndex(rcv.URL, ":")+1:]
	res := &fakeResolver{names: map[string][]netip.Addr{"hook.test": {netip.MustParseAddr("127.0.0.1")}}}
	s := &Sender{Guard: &Guard{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, Resolver: res, Timeout: 2 * time.Second}
	if a := s.Send(context.Background(), "wh", "http://hook.test:"+port+"/", "k", []byte(`{}`)); a.Err != nil {
		t.Fatal(a.Err)
	}
	if n := res.lookups.Load(); n != 1 {
		t.Errorf("%d lookups for one attempt", n)
	}
}

// TestSendFollowsNoRedirect: a 3xx to an internal address (or anywhere)
// is a failed attempt; its target is not asked.
func TestSendFollowsNoRedirect(t *testing.T) {
	inner := newReceiver(t, ok)
	outer := newReceiver(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, inner.URL+"/admin", http.StatusTemporaryRedirect)
	})
	s := &Sender{Guard: &Guard{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, Timeout: 2 * time.Second}
	a := s.Send(context.Background(), "wh", outer.URL, "k", []byte(`{}`))
	if a.Err == nil || a.Status != http.StatusTemporaryRedirect {
		t.Errorf("redirect: %+v", a)
	}
	for _, to := range []string{"http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/"} {
		r := newReceiver(t, func(w http.ResponseWriter, req *http.Request) { http.Redirect(w, req, to, http.StatusFound) })
		if a := s.Send(context.Background(), "wh", r.URL, "k", []byte(`{}`)); a.Err == nil || a.Status != http.StatusFound {
			t.Errorf("redirect to %s: %+v", to, a)
		}
	}
	if n := inner.hits.Load(); n != 0 {
		t.Errorf("the redirect's target was reached %d times", n)
	}
}

// TestSendIsBounded: an endpoint that never answers, or answers and
// streams forever, ends the attempt (by its timeout, or the read bound).
func TestSendIsBounded(t *testing.T) {
	release := make(chan struct{})
	silent := newReceiver(t, func(w http.ResponseWriter, r *http.Request) { <-release })
	streaming := newReceiver(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		chunk := make([]byte, 4096)
		for {
			select {
			case <-release:
				return
			default:
			}
			if _, err := w.Write(chunk); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	})
	// After the receivers' Close (cleanups run last first): their
	// handlers end before the servers wait for them.
	t.Cleanup(func() { close(release) })
	s := &Sender{Guard: &Guard{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, Timeout: 300 * time.Millisecond}
	done := make(chan Attempt, 2)
	go func() { done <- s.Send(context.Background(), "wh", silent.URL, "k", []byte(`{}`)) }()
	go func() { done <- s.Send(context.Background(), "wh", streaming.URL, "k", []byte(`{}`)) }()
	var got []Attempt
	for range 2 {
		select {
		case a := <-done:
			got = append(got, a)
		case <-time.After(20 * time.Second):
			t.Fatal("an attempt did not end")
		}
	}
	var failed, answered int
	for _, a := range got {
		if a.Err != nil && a.Status == 0 {
			failed++ // the silent one: timed out
		}
		if a.Status == http.StatusOK {
			answered++ // the stream: 200, its body cut
		}
	}
	if failed != 1 || answered != 1 {
		t.Errorf("attempts = %+v", got)
	}
}
