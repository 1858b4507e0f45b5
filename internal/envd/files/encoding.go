package files

import (
	"net/http"
	"strconv"
	"strings"
)

// responseEncoding picks the download's Content-Encoding: gzip or none.
// acceptable is false when the client refuses identity and gzip alike.
//
// Policy: compress only when the client asks for gzip alone, which is what
// the SDK's read({gzip: true}) sends ("Accept-Encoding: gzip"). undici, the
// SDK's HTTP client, sends "gzip, deflate" with every request; compressing
// those default reads would cap them at gzip's speed. Measured on a 2-vCPU
// machine over loopback with 50 MiB (BenchmarkDownload*): plain ~950 MB/s,
// gzip level 1 ~270 MB/s end to end on incompressible data (its worst
// case; compression alone runs at 350-450 MB/s), and Go's default level
// only 40-100 MB/s, which is why the explicit path uses level 1.
// Go's http.Transport also sends a bare "gzip" by default, so Go clients
// get compressed responses (decoded transparently) unless they set the
// header themselves.
//
// Range and conditional requests are answered uncompressed, so that
// http.ServeContent can give 206 and 304 answers, unless the client refuses
// identity: then it gets the whole file gzipped (a server may ignore Range).
func responseEncoding(r *http.Request) (useGzip, acceptable bool) {
	c := parseAcceptEncoding(r.Header.Values("Accept-Encoding"))
	gzipOK := c.accepts("gzip") || c.accepts("x-gzip")
	if !c.accepts("identity") {
		return gzipOK, gzipOK
	}
	if hasRangeOrCondition(r) {
		return false, true
	}
	return gzipOK && c.onlyGzip(), true
}

func hasRangeOrCondition(r *http.Request) bool {
	for _, h := range []string{"Range", "If-Range", "If-Modified-Since", "If-None-Match", "If-Match", "If-Unmodified-Since"} {
		if r.Header.Get(h) != "" {
			return true
		}
	}
	return false
}

// acceptEncoding maps each coding listed in Accept-Encoding to whether its
// q-value is above zero.
type acceptEncoding map[string]bool

func parseAcceptEncoding(values []string) acceptEncoding {
	c := acceptEncoding{}
	for _, v := range values {
		for _, part := range strings.Split(v, ",") {
			name, params, _ := strings.Cut(part, ";")
			name = strings.ToLower(strings.TrimSpace(name))
			if name == "" {
				continue
			}
			c[name] = qAboveZero(params)
		}
	}
	return c
}

// qAboveZero reads the q parameter of one Accept-Encoding element; a
// missing or unparsable q counts as 1 (RFC 9110 §12.4.2).
func qAboveZero(params string) bool {
	for _, p := range strings.Split(params, ";") {
		k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
		if strings.EqualFold(strings.TrimSpace(k), "q") {
			q, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return err != nil || q > 0
		}
	}
	return true
}

// accepts reports whether coding is acceptable: listed with q > 0, or not
// listed and matched by "*" (identity is acceptable unless excluded).
func (c acceptEncoding) accepts(coding string) bool {
	if ok, listed := c[coding]; listed {
		return ok
	}
	if ok, listed := c["*"]; listed {
		return ok
	}
	return coding == "identity"
}

// onlyGzip reports whether gzip is the one compression the client offered.
func (c acceptEncoding) onlyGzip() bool {
	for name, ok := range c {
		if ok && name != "gzip" && name != "x-gzip" && name != "identity" {
			return false
		}
	}
	return true
}
