package envdinfo

import (
	"net/http"
	"strconv"
	"strings"
)

// CORS as E2B's envd answers it, so that the browser SDK (E2B's
// dashboard's terminal and file browser) can call envd from any page:
// every origin, the methods and request headers it asks for, and the
// Connect and file headers exposed. Credentials are never allowed
// (no Access-Control-Allow-Credentials): a page's call carries only
// what its script puts in headers (X-Access-Token, which it must already
// hold), never the browser's cookies or cached authentication, so CORS
// gives a foreign page nothing its server could not do with the same
// token. An open envd (a sandbox created without secure) answers any
// page that knows its sandbox ID, as it answers any client.
const (
	corsMethods = "HEAD, GET, POST, PUT, PATCH, DELETE"
	// corsExposed: Connect's error headers for gRPC-Web clients, and what
	// E2B's envd adds.
	corsExposed = "Grpc-Status, Grpc-Message, Grpc-Status-Details-Bin, Location, Cache-Control, X-Content-Type-Options"
	// corsMaxAge is how long a browser may keep a preflight's answer.
	corsMaxAge = 2 * 60 * 60
	// maxRequestHeaders bounds the echoed Access-Control-Request-Headers.
	maxRequestHeaders = 4096
)

// CORS answers a preflight (and reports true: nothing else to do) or
// adds the CORS headers to an actual cross-origin request's answer. The
// proxy answers with it the preflights it cannot route (a preflight
// carries no E2b-Sandbox-Id: see internal/proxy), so that a page reaches
// envd through E2B_SANDBOX_URL with the grant envd itself gives.
func CORS(w http.ResponseWriter, r *http.Request) (done bool) {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return false
	}
	h := w.Header()
	h.Add("Vary", "Origin")
	if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
		h.Add("Vary", "Access-Control-Request-Method")
		h.Add("Vary", "Access-Control-Request-Headers")
		method := strings.ToUpper(r.Header.Get("Access-Control-Request-Method"))
		if !strings.Contains(", "+corsMethods+", ", ", "+method+", ") {
			w.WriteHeader(http.StatusNoContent) // no grant: the browser refuses the call
			return true
		}
		h.Set("Access-Control-Allow-Origin", "*")
		h.Set("Access-Control-Allow-Methods", method)
		if req := r.Header.Get("Access-Control-Request-Headers"); req != "" && len(req) <= maxRequestHeaders {
			h.Set("Access-Control-Allow-Headers", req)
		}
		h.Set("Access-Control-Max-Age", strconv.Itoa(corsMaxAge))
		w.WriteHeader(http.StatusNoContent)
		return true
	}
	h.Set("Access-Control-Allow-Origin", "*")
	h.Set("Access-Control-Expose-Headers", corsExposed)
	return false
}
