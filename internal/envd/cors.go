package envd

import (
	"net/http"

	"github.com/warren-sandbox/warren/internal/envdinfo"
)

// cors is envd's CORS, E2B's envd's: see envdinfo.CORS, which the proxy
// shares for the preflights it answers itself.
func cors(w http.ResponseWriter, r *http.Request) (done bool) { return envdinfo.CORS(w, r) }
