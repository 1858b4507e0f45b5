// Package auth issues and checks the platform's credentials: API keys
// ("e2b_…", sent as X-API-Key) and access tokens ("sk_e2b_…", sent as
// Authorization: Bearer). Only a SHA-256 of each is stored; keys carry
// 160 random bits, so a fast hash is enough (nothing to brute-force).
//
// On first start of an empty data directory, Bootstrap creates the
// default team, one API key and one access token, prints them once and
// writes them to <data dir>/credentials (mode 0600). WARREN_API_KEY and
// WARREN_ACCESS_TOKEN preset them instead of generating.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/store"
)

// Prefixes of the two kinds of credentials, as E2B's.
const (
	APIKeyPrefix      = "e2b_"
	AccessTokenPrefix = "sk_e2b_"
)

// DefaultTeamID is the team Bootstrap creates.
const DefaultTeamID = "default"

// ErrUnauthorized is returned for a missing, malformed or unknown credential.
var ErrUnauthorized = errors.New("invalid credentials")

// Hash is how a credential is stored.
func Hash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// Mask shows enough of a credential to recognise it in a listing.
func Mask(secret string) string {
	if len(secret) <= 12 {
		return strings.Repeat("*", len(secret))
	}
	return secret[:8] + "…" + secret[len(secret)-4:]
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b)
}

// NewSecret returns a fresh credential of the kind: its prefix and 40
// hex digits (160 bits).
func NewSecret(kind store.KeyKind) string {
	if kind == store.KindAccessToken {
		return AccessTokenPrefix + randomHex(20)
	}
	return APIKeyPrefix + randomHex(20)
}

func kindOf(secret string) (store.KeyKind, bool) {
	switch {
	case strings.HasPrefix(secret, AccessTokenPrefix):
		return store.KindAccessToken, true
	case strings.HasPrefix(secret, APIKeyPrefix):
		return store.KindAPIKey, true
	}
	return "", false
}

// CreateKey stores a credential (generating it when secret is "") and
// returns the secret, which is never shown again.
func CreateKey(ctx context.Context, s store.Store, teamID string, kind store.KeyKind, name, secret string) (store.Key, string, error) {
	if secret == "" {
		secret = NewSecret(kind)
	}
	if k, ok := kindOf(secret); !ok || k != kind {
		want := APIKeyPrefix
		if kind == store.KindAccessToken {
			want = AccessTokenPrefix
		}
		return store.Key{}, "", fmt.Errorf("auth: a %s must start with %q", kind, want)
	}
	k := store.Key{
		ID: randomHex(8), TeamID: teamID, Kind: kind, Name: name,
		Hash: Hash(secret), Mask: Mask(secret), CreatedAt: time.Now(),
	}
	if err := s.CreateKey(ctx, k); err != nil {
		return store.Key{}, "", err
	}
	return k, secret, nil
}

// Authenticate returns the key a secret belongs to; kind says which header
// it came in (an access token is not accepted as an API key or back).
func Authenticate(ctx context.Context, s store.Store, kind store.KeyKind, secret string) (store.Key, error) {
	if k, ok := kindOf(secret); !ok || k != kind {
		return store.Key{}, ErrUnauthorized
	}
	key, err := s.KeyByHash(ctx, kind, Hash(secret))
	if errors.Is(err, store.ErrNotFound) {
		return store.Key{}, ErrUnauthorized
	}
	return key, err
}

// Credentials are what Bootstrap made for a first start.
type Credentials struct {
	APIKey      string
	AccessToken string
	File        string
}

// Bootstrap makes sure the default team exists. On its first run it
// creates an API key and an access token (taken from apiKey and
// accessToken when not empty), writes them to dataDir/credentials and
// returns them; later runs return nil, but still add preset credentials
// that are not stored yet, so a preset key works on every start.
func Bootstrap(ctx context.Context, s store.Store, dataDir, apiKey, accessToken string) (*Credentials, error) {
	_, err := s.GetTeam(ctx, DefaultTeamID)
	if err == nil {
		for kind, secret := range map[store.KeyKind]string{store.KindAPIKey: apiKey, store.KindAccessToken: accessToken} {
			if secret == "" {
				continue
			}
			if _, err := Authenticate(ctx, s, kind, secret); errors.Is(err, ErrUnauthorized) {
				if _, _, err := CreateKey(ctx, s, DefaultTeamID, kind, "preset", secret); err != nil {
					return nil, err
				}
			} else if err != nil {
				return nil, err
			}
		}
		return nil, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	if err := s.CreateTeam(ctx, store.Team{ID: DefaultTeamID, Name: "default", CreatedAt: time.Now()}); err != nil {
		return nil, err
	}
	_, key, err := CreateKey(ctx, s, DefaultTeamID, store.KindAPIKey, "initial", apiKey)
	if err != nil {
		return nil, err
	}
	_, token, err := CreateKey(ctx, s, DefaultTeamID, store.KindAccessToken, "initial", accessToken)
	if err != nil {
		return nil, err
	}
	c := &Credentials{APIKey: key, AccessToken: token, File: filepath.Join(dataDir, "credentials")}
	body := fmt.Sprintf("E2B_API_KEY=%s\nE2B_ACCESS_TOKEN=%s\n", key, token)
	if err := os.WriteFile(c.File, []byte(body), 0o600); err != nil {
		return nil, err
	}
	return c, nil
}
