// Package files serves envd's GET and POST /files: downloads and uploads.
package files

import (
	"net/http"

	"github.com/warren-sandbox/warren/internal/envd/settings"
)

// NewHandler returns the /files handler.
func NewHandler(s *settings.Settings) http.Handler {
	return http.NotFoundHandler()
}
