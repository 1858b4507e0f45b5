package webhook

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/google/uuid"
)

// E2B's delivery headers.
const (
	HeaderWebhookID        = "e2b-webhook-id"
	HeaderDeliveryID       = "e2b-delivery-id"
	HeaderSignatureVersion = "e2b-signature-version"
	HeaderSignature        = "e2b-signature"
	SignatureVersion       = "v1"
)

// Sign is E2B's e2b-signature of a body: the SHA-256 of the secret
// followed by the raw body, in standard base64 without its padding.
func Sign(secret string, body []byte) string {
	h := sha256.New()
	h.Write([]byte(secret))
	h.Write(body)
	return base64.RawStdEncoding.EncodeToString(h.Sum(nil))
}

// maxResponseRead bounds what is read of a receiver's answer (it is
// discarded): one that streams forever costs no more than this.
const maxResponseRead = 64 << 10

// Sender makes delivery attempts.
type Sender struct {
	Guard    *Guard
	Resolver Resolver
	// Timeout bounds an attempt: connecting, sending, the answer's
	// headers and the bounded read of its body (default
	// DefaultAttemptTimeout).
	Timeout time.Duration
}

// Attempt is a delivery attempt's result: the answer's status (0: none)
// and, unless it was a 2xx, why it failed.
type Attempt struct {
	DeliveryID string
	Status     int
	Duration   time.Duration
	Err        error
}

// Send posts body to rawURL once, signed with secret, as E2B does. The
// URL's host is resolved once and the connection pinned to that address
// (checked by the guard, again at the socket); redirects are not
// followed (a 3xx is a failure); the attempt ends by s.Timeout.
func (s *Sender) Send(ctx context.Context, webhookID, rawURL, secret string, body []byte) Attempt {
	start := time.Now()
	a := Attempt{DeliveryID: uuid.NewString()}
	a.Status, a.Err = s.send(ctx, a.DeliveryID, webhookID, rawURL, secret, body)
	a.Duration = time.Since(start)
	return a
}

func (s *Sender) send(ctx context.Context, deliveryID, webhookID, rawURL, secret string, body []byte) (int, error) {
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = DefaultAttemptTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	u, err := url.Parse(rawURL)
	if err != nil {
		return 0, fmt.Errorf("%w: the url does not parse", ErrRefused)
	}
	resolver := s.Resolver
	if resolver == nil {
		resolver = net.DefaultResolver
	}
	pinned, err := s.Guard.pin(ctx, resolver, u.Hostname())
	if err != nil {
		return 0, err
	}
	tr := &http.Transport{
		Proxy:                  nil, // never the environment's proxy
		DialContext:            s.Guard.dialer(pinned, &net.Dialer{Timeout: timeout}),
		DisableKeepAlives:      true,
		ForceAttemptHTTP2:      false,
		TLSHandshakeTimeout:    timeout,
		ResponseHeaderTimeout:  timeout,
		MaxResponseHeaderBytes: 16 << 10,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rawURL, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "Warren-Webhooks/1")
	req.Header.Set(HeaderWebhookID, webhookID)
	req.Header.Set(HeaderDeliveryID, deliveryID)
	req.Header.Set(HeaderSignatureVersion, SignatureVersion)
	req.Header.Set(HeaderSignature, Sign(secret, body))
	resp, err := client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL is the webhook's, known to its team
		}
		return 0, err
	}
	defer resp.Body.Close()
	// The answer is read (bounded) so the receiver sees its reply taken,
	// then dropped; a body still streaming when the bound or the
	// deadline comes is cut.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseRead))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, fmt.Errorf("the endpoint answered %d", resp.StatusCode)
	}
	return resp.StatusCode, nil
}
