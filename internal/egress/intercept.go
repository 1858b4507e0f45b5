package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"time"

	"golang.org/x/net/http/httpguts"
)

// interceptTLS terminates the client's TLS with a certificate of the
// node's CA for host, opens TLS to the real host (verifying it), and
// rewrites the requests in between.
func (cn *conn) interceptTLS(up net.Conn, hello []byte, host string, rule HostRule) {
	p := cn.p
	if p.cfg.CA == nil {
		reset(up)
		cn.deny(cn.entry.Rule, "the host has rules, but this node has no CA to intercept TLS with")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.DialTimeout)
	defer cancel()
	upTLS := tls.Client(up, &tls.Config{ServerName: host, RootCAs: p.cfg.RootCAs, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
	if err := upTLS.HandshakeContext(ctx); err != nil {
		reset(up)
		cn.deny(cn.entry.Rule, "TLS to the real host failed: "+err.Error())
		return
	}
	leaf, err := p.cfg.CA.Leaf(host)
	if err != nil {
		upTLS.Close()
		cn.deny(cn.entry.Rule, "issuing a certificate: "+err.Error())
		return
	}
	client := tls.Server(&prefixConn{Conn: cn.client, prefix: hello}, &tls.Config{
		Certificates: []tls.Certificate{*leaf}, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12,
	})
	if err := client.HandshakeContext(ctx); err != nil {
		upTLS.Close()
		cn.deny(cn.entry.Rule, "TLS with the sandbox failed: "+err.Error())
		return
	}
	p.cfg.Audit.Log(cn.entry)
	cn.relayHTTP(client, upTLS, host, &rule)
}

// relayHTTP relays HTTP/1 requests from client to up one by one, so that
// each is judged by the host it names (its Host, and its absolute target's
// host), not only the first of a keep-alive connection.
//
// With a rule (a host with transforms, plain or intercepted TLS), every
// request gets the rule's headers, and one that names another host ends
// the connection with 421: a connection to one host never carries a
// secret to another. Each request is audited.
//
// Without (plain HTTP), a request that names the connection's host goes
// on; one that names another host is judged by the sandbox's current
// policy (checkOtherHost) and audited, refused with 403 or 421 when it
// may not go on this connection.
func (cn *conn) relayHTTP(client, up net.Conn, host string, rule *HostRule) {
	defer client.Close()
	defer up.Close()
	p := cn.p
	// The head of each request is bounded, as net/http's server bounds
	// it; its body is not.
	lr := &io.LimitedReader{R: client}
	cr, ur := bufio.NewReader(lr), bufio.NewReader(up)
	for {
		_ = client.SetReadDeadline(time.Now().Add(p.cfg.IdleTimeout))
		lr.N = maxRequestHead
		req, err := http.ReadRequest(cr)
		if err != nil {
			return
		}
		lr.N = math.MaxInt64
		_ = client.SetReadDeadline(time.Time{})
		// The request goes on as it came: no User-Agent is added where
		// it had none, and no 100-continue is awaited (the body is
		// forwarded as it comes, and a 100 answer would be one answer
		// too many).
		if _, ok := req.Header["User-Agent"]; !ok {
			req.Header["User-Agent"] = []string{""}
		}
		req.Header.Del("Expect")
		e := cn.entry
		e.Time, e.Request, e.Host, e.Via = time.Time{}, req.Method, req.Host, cn.entry.Via
		other := otherHost(req, host)
		switch {
		case other == nil && rule == nil:
			// The connection's own host, already judged and audited.
		case other != nil && rule != nil:
			e.Decision, e.Reason = Deny, "a request on a connection to "+host+" names another host"
			p.cfg.Audit.Log(e)
			writeStatus(client, http.StatusMisdirectedRequest, "this connection is to "+host+"; open another one for another host")
			return
		case other != nil:
			code, v, reason := cn.checkOtherHost(up, *other)
			e.Rule, e.Reason = v.rule, reason
			if code != 0 {
				e.Decision = Deny
				p.cfg.Audit.Log(e)
				writeStatus(client, code, "Warren egress policy: "+reason)
				return
			}
			e.Decision = Allow
			p.cfg.Audit.Log(e)
		default:
			injected, err := cn.transform(req, *rule)
			if err != nil {
				e.Decision, e.Reason = Deny, err.Error()
				p.cfg.Audit.Log(e)
				writeStatus(client, http.StatusBadGateway, "Warren egress rule for "+host+": "+err.Error())
				return
			}
			e.Decision, e.Injected = Allow, injected
			p.cfg.Audit.Log(e)
		}
		if err := req.Write(up); err != nil {
			return
		}
		res, err := http.ReadResponse(ur, req)
		if err != nil {
			return
		}
		if res.StatusCode == http.StatusSwitchingProtocols {
			if err := res.Write(client); err != nil {
				return
			}
			splice(&readerConn{Conn: client, r: cr}, &readerConn{Conn: up, r: ur})
			return
		}
		err = res.Write(client)
		res.Body.Close()
		if err != nil || res.Close || req.Close {
			return
		}
	}
}

// maxRequestHead bounds a relayed request's line and headers.
const maxRequestHead = 1 << 20

// otherHost returns the host a request names that is not the
// connection's (its Host, else its absolute target's), or nil if it names
// only the connection's.
func otherHost(req *http.Request, host string) *string {
	if h := NormalizeHost(req.Host); h != host {
		return &h
	}
	if req.URL.IsAbs() {
		if h := NormalizeHost(req.URL.Host); h != host {
			return &h
		}
	}
	return nil
}

// checkOtherHost judges a plain-HTTP request that names another host than
// its connection's by the sandbox's current policy, and whether the
// connection may carry it: an address or default allowance holds for any
// host on it, but a domain allowance only to an address of that name, and
// a host with rules needs a connection of its own. It returns 0, or the
// status to refuse the request with and why.
func (cn *conn) checkOtherHost(up net.Conn, host string) (int, verdict, string) {
	p := cn.p
	sb, ok := p.lookup(cn.src)
	if !ok {
		return http.StatusForbidden, verdict{rule: "node"}, "the sandbox is gone"
	}
	pol := sb.Policy
	v := judge(pol, cn.dst, host)
	if !v.allow {
		return http.StatusForbidden, v, "requests to " + displayHost(host) + " are not allowed"
	}
	if _, hasRule := pol.RuleFor(host); hasRule && host != "" {
		return http.StatusMisdirectedRequest, v, displayHost(host) + " has egress rules: open a connection of its own for it"
	}
	if !v.domain {
		return 0, v, ""
	}
	upAddr, err := netip.ParseAddrPort(up.RemoteAddr().String())
	if pol.Upstream != nil || err != nil {
		return http.StatusMisdirectedRequest, v, "this connection is not to " + displayHost(host) + ": open another one for it"
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.DialTimeout)
	defer cancel()
	addrs, err := p.dial.resolve(ctx, host)
	if err != nil || !slices.Contains(addrs, upAddr.Addr().Unmap()) {
		return http.StatusMisdirectedRequest, v, "this connection is not to an address of " + displayHost(host) + ": open another one for it"
	}
	return 0, v, ""
}

func displayHost(h string) string {
	if h == "" {
		return "no host name"
	}
	return h
}

// transform sets the rule's headers on req, resolving secrets and
// minting identity tokens, and returns the names it set. Errors never
// carry a secret's value or a token.
func (cn *conn) transform(req *http.Request, rule HostRule) ([]string, error) {
	req.Header.Del("Expect") // the proxy forwards the body without waiting for 100-continue
	var names []string
	secret := func(name string) (string, error) {
		if cn.p.cfg.Secrets == nil {
			return "", errors.New("this node resolves no secrets")
		}
		ctx, cancel := context.WithTimeout(req.Context(), 5*time.Second)
		defer cancel()
		v, err := cn.p.cfg.Secrets(ctx, cn.sb.TeamID, name)
		if err != nil {
			return "", fmt.Errorf("secret %q: %w", name, err)
		}
		return v, nil
	}
	token := func(name string) (string, error) {
		// Only a token the sandbox asked for, for its audience, for
		// the sandbox the connection is from.
		aud, ok := cn.sb.Policy.Identity[name]
		if !ok {
			return "", fmt.Errorf("identity token %q is not one of the sandbox's iam.tokens", name)
		}
		if cn.p.cfg.Identity == nil {
			return "", errors.New("this node mints no identity tokens")
		}
		v, err := cn.p.cfg.Identity(cn.sb.TeamID, cn.sb.ID, aud)
		if err != nil {
			return "", fmt.Errorf("identity token %q: %w", name, err)
		}
		return v, nil
	}
	for _, h := range rule.Headers {
		v, err := ExpandPlaceholders(h.Value, secret, token)
		if err != nil {
			return nil, err
		}
		if !httpguts.ValidHeaderFieldValue(v) {
			return nil, fmt.Errorf("header %s: a secret's value is not a valid header value", h.Name)
		}
		req.Header.Set(h.Name, v)
		names = append(names, h.Name)
	}
	return names, nil
}

// writeStatus answers a plain-text error and ends the exchange.
func writeStatus(c net.Conn, code int, msg string) {
	msg += "\n"
	_, _ = fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, http.StatusText(code), len(msg), msg)
}

// readerConn reads through a bufio.Reader that may hold bytes already.
type readerConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c *readerConn) CloseWrite() error { return closeWrite(c.Conn) }
