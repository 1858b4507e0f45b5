package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
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
	cn.interceptHTTP(client, upTLS, host, rule)
}

// interceptHTTP relays HTTP/1 requests from client to up one by one,
// setting rule's headers on each. A request that names another host ends
// the connection with 421: a connection to one host never carries a
// secret to another.
func (cn *conn) interceptHTTP(client, up net.Conn, host string, rule HostRule) {
	defer client.Close()
	defer up.Close()
	p := cn.p
	cr, ur := bufio.NewReader(client), bufio.NewReader(up)
	for {
		_ = client.SetReadDeadline(time.Now().Add(p.cfg.IdleTimeout))
		req, err := http.ReadRequest(cr)
		if err != nil {
			return
		}
		_ = client.SetReadDeadline(time.Time{})
		e := cn.entry
		e.Time, e.Request, e.Host, e.Via = time.Time{}, req.Method, req.Host, cn.entry.Via
		if NormalizeHost(req.Host) != host || (req.URL.IsAbs() && NormalizeHost(req.URL.Host) != host) {
			e.Decision, e.Reason = Deny, "a request on a connection to "+host+" names another host"
			p.cfg.Audit.Log(e)
			writeStatus(client, http.StatusMisdirectedRequest, "this connection is to "+host+"; open another one for another host")
			return
		}
		injected, err := cn.transform(req, rule)
		if err != nil {
			e.Decision, e.Reason = Deny, err.Error()
			p.cfg.Audit.Log(e)
			writeStatus(client, http.StatusBadGateway, "Warren egress rule for "+host+": "+err.Error())
			return
		}
		e.Decision, e.Injected = Allow, injected
		p.cfg.Audit.Log(e)
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

// transform sets the rule's headers on req, resolving secrets, and
// returns the names it set. Errors never carry a secret's value.
func (cn *conn) transform(req *http.Request, rule HostRule) ([]string, error) {
	req.Header.Del("Expect") // the proxy forwards the body without waiting for 100-continue
	var names []string
	for _, h := range rule.Headers {
		v, err := ExpandPlaceholders(h.Value, func(name string) (string, error) {
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
		})
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
