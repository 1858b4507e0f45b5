package files

import (
	"net/http"
	"strings"
)

// metadataXattrPrefix namespaces user metadata in extended attributes.
const metadataXattrPrefix = "user.e2b."

// Metadata limits: printable ASCII, keys up to 246 bytes (255 minus the
// xattr prefix), 4 KiB for all keys and values together.
const (
	maxMetadataKey   = 246
	maxMetadataTotal = 4096
)

// parseMetadata collects X-Metadata-<key> headers into key → value, keys
// lowercased. The result is the file's whole metadata set: an upload
// writes a new file (see writeFile), so metadata from an earlier upload
// never survives, and no headers means no metadata.
func parseMetadata(h http.Header) (map[string]string, error) {
	var meta map[string]string
	total := 0
	for k, vs := range h {
		key, ok := strings.CutPrefix(strings.ToLower(k), "x-metadata-")
		if !ok || len(vs) == 0 {
			continue
		}
		if key == "" {
			continue // a bare "X-Metadata-" names nothing; infra drops it too
		}
		val := vs[0] // repeated headers: the first value counts
		if len(key) > maxMetadataKey {
			return nil, failf(http.StatusBadRequest, "metadata key %q is longer than %d bytes", key, maxMetadataKey)
		}
		if !printable(key) || !printable(val) {
			return nil, failf(http.StatusBadRequest, "metadata %q must be printable ASCII", key)
		}
		total += len(key) + len(val)
		if total > maxMetadataTotal {
			return nil, failf(http.StatusBadRequest, "metadata exceeds %d bytes", maxMetadataTotal)
		}
		if meta == nil {
			meta = map[string]string{}
		}
		meta[key] = val
	}
	return meta, nil
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
