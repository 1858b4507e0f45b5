package files

import "github.com/warren-sandbox/warren/internal/filesig"

// fileQuery is what the query of a /files URL says (filesig.Query).
type fileQuery = filesig.Query

// parseFileQuery reads the raw query of a /files URL (filesig.ParseQuery).
func parseFileQuery(raw string) (fileQuery, error) { return filesig.ParseQuery(raw) }

// Signature computes the signature of a pre-signed /files URL
// (filesig.Signature).
func Signature(path, operation, user, token string, expiration *int64) string {
	return filesig.Signature(path, operation, user, token, expiration)
}
