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

	"github.com/google/uuid"

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

// MaxTeamKeys bounds a team's credentials, API keys and access tokens
// together: CreateKey refuses more with ErrTooManyKeys. (GET /teams makes
// a key on every call, as E2B's does, so the bound is what keeps a
// looping client from filling the store.)
const MaxTeamKeys = 1000

// ErrTooManyKeys: the team has MaxTeamKeys credentials.
var ErrTooManyKeys = errors.New("too many keys")

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

// Masked is a credential as E2B's API shows it in listings (its
// IdentifierMaskingDetails): the kind's prefix, the length of the rest,
// and the rest's first two and last four characters.
type Masked struct {
	Prefix      string
	ValueLength int
	First, Last string
}

// MaskOf shows a stored key as E2B does. The parts come from its Mask
// (the secret's first eight characters, "…", its last four); a secret too
// short to have shown any shows none. ValueLength is 0 for keys stored
// before their length was.
func MaskOf(k store.Key) Masked {
	prefix := APIKeyPrefix
	if k.Kind == store.KindAccessToken {
		prefix = AccessTokenPrefix
	}
	m := Masked{Prefix: prefix, ValueLength: k.ValueLength}
	head, tail, ok := strings.Cut(k.Mask, "…")
	if !ok {
		return m
	}
	if rest, ok := strings.CutPrefix(head, prefix); ok {
		m.First = rest[:min(2, len(rest))]
	}
	m.Last = tail
	return m
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
	have, err := s.ListKeys(ctx, teamID)
	if err != nil {
		return store.Key{}, "", err
	}
	if len(have) >= MaxTeamKeys {
		return store.Key{}, "", fmt.Errorf("%w: the team has %d keys and access tokens, the most it may have; delete some first", ErrTooManyKeys, len(have))
	}
	prefix := APIKeyPrefix
	if kind == store.KindAccessToken {
		prefix = AccessTokenPrefix
	}
	k := store.Key{
		ID: uuid.NewString(), TeamID: teamID, Kind: kind, Name: name,
		Hash: Hash(secret), Mask: Mask(secret), ValueLength: len(secret) - len(prefix), CreatedAt: time.Now(),
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
