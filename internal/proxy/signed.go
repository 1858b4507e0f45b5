package proxy

// SignedCandidate is a sandbox whose envd access token may have signed a
// URL (see Resolver.SignedBy).
type SignedCandidate struct {
	ID, EnvdAccessToken string
}

// FirstSigned returns the ID of the first candidate whose token signed
// holds for, or ErrNotFound. It asks signed of every candidate, whatever
// the answers, so that the time taken tells a caller nothing of which
// sandbox (or whether any) matched.
func FirstSigned(cands []SignedCandidate, signed func(envdAccessToken string) bool) (string, error) {
	found := ""
	for _, c := range cands {
		if signed(c.EnvdAccessToken) && found == "" {
			found = c.ID
		}
	}
	if found == "" {
		return "", ErrNotFound
	}
	return found, nil
}
