// Package secret keeps team secrets: named values with versions that the
// API writes and never returns, and that only the egress proxy reads, to
// put into the requests of hosts with rules (${e2b.secrets.NAME}).
//
// Values are sealed with AES-256-GCM under the node's key, a file in the
// data dir (secret.key, mode 0600) made on first use — or, in a cluster,
// a key derived from the cluster secret, the same in every process
// (SealerFromClusterSecret) — and bound to their
// team, secret and version (the additional data), so a sealed value moved
// to another row does not open. The database never holds a value in
// clear, and no error, log line or API answer carries one. Every lookup
// is scoped by team; an empty team is an error.
//
// The same Sealer keeps other values the API takes and never returns,
// such as an egressProxy's password.
package secret

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/store"
)

// KeyFile is the node key's file name in the data dir.
const KeyFile = "secret.key"

// Sealer seals and opens values with the node key.
type Sealer struct {
	aead cipher.AEAD
}

// LoadSealer reads the node key from dir, creating it (0600) on first use.
func LoadSealer(dir string) (*Sealer, error) {
	path := filepath.Join(dir, KeyFile)
	key, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, key, 0o600); err != nil {
			return nil, fmt.Errorf("secret: writing the node key: %w", err)
		}
		if err := os.Rename(tmp, path); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, fmt.Errorf("secret: reading the node key: %w", err)
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("secret: %s holds %d bytes, not a 32-byte key", path, len(key))
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(path, 0o600); err != nil {
			return nil, err
		}
	}
	return newSealer(key)
}

// clusterKeyInfo names what a key derived from the cluster secret is for,
// so that it differs from every other key derived from that secret.
const clusterKeyInfo = "warren secret sealing key v1"

// SealerFromClusterSecret derives the key from the cluster secret, which
// every process of a cluster has: secrets one API replica seals, any node
// opens. A new cluster secret makes the values sealed under the old one
// unreadable (they must be written again).
func SealerFromClusterSecret(clusterSecret []byte) (*Sealer, error) {
	if len(clusterSecret) < 32 {
		return nil, fmt.Errorf("secret: the cluster secret has %d bytes, fewer than 32", len(clusterSecret))
	}
	key, err := hkdf.Key(sha256.New, clusterSecret, nil, clusterKeyInfo, 32)
	if err != nil {
		return nil, err
	}
	return newSealer(key)
}

func newSealer(key []byte) (*Sealer, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Sealer{aead: aead}, nil
}

const sealedPrefix = "v1:"

// Seal encrypts value bound to context (what it belongs to).
func (s *Sealer) Seal(value, context string) (string, error) {
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	out := s.aead.Seal(nonce, nonce, []byte(value), []byte(context))
	return sealedPrefix + base64.RawStdEncoding.EncodeToString(out), nil
}

// ErrSealed: a sealed value does not open (another key, or context).
var ErrSealed = errors.New("secret: a sealed value does not open with this node's key")

// Open decrypts a value sealed with the same context.
func (s *Sealer) Open(sealed, context string) (string, error) {
	raw, err := base64.RawStdEncoding.DecodeString(strings.TrimPrefix(sealed, sealedPrefix))
	if err != nil || !strings.HasPrefix(sealed, sealedPrefix) || len(raw) < s.aead.NonceSize() {
		return "", ErrSealed
	}
	n := s.aead.NonceSize()
	out, err := s.aead.Open(nil, raw[:n], raw[n:], []byte(context))
	if err != nil {
		return "", ErrSealed
	}
	return string(out), nil
}

// Limits on what a team may store.
const (
	MaxValueBytes    = 64 << 10
	MaxMetadataPairs = 32
	maxMetaKey       = 128
	maxMetaValue     = 1024
	maxMetaTotal     = 8192
	// CacheTTL is how long the proxy reuses a value it resolved. Updates
	// and deletes on this node drop it at once.
	CacheTTL = 5 * time.Second
)

// Errors the API maps to statuses.
var (
	ErrInvalid  = errors.New("invalid secret")
	ErrNotFound = errors.New("secret not found")
	ErrConflict = errors.New("a secret of that name exists")
	ErrLimit    = errors.New("secret limit reached")
)

// Service is the team secrets of a store.
type Service struct {
	st     store.SecretStore
	sealer *Sealer

	mu    sync.Mutex
	cache map[string]cached // "team/name" → value
}

type cached struct {
	value string
	until time.Time
}

// New returns the service.
func New(st store.SecretStore, sealer *Sealer) *Service {
	return &Service{st: st, sealer: sealer, cache: map[string]cached{}}
}

func versionContext(teamID, id string, version int64) string {
	return fmt.Sprintf("secret/%s/%s/%d", teamID, id, version)
}

// Create makes a team secret with its first value.
func (s *Service) Create(ctx context.Context, teamID, name, value string, metadata map[string]string) (store.Secret, error) {
	if teamID == "" {
		return store.Secret{}, errors.New("secret: a team is required")
	}
	n, err := egress.NormalizeSecretName(name)
	if err != nil {
		return store.Secret{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := checkValue(value); err != nil {
		return store.Secret{}, err
	}
	if err := checkMetadata(metadata); err != nil {
		return store.Secret{}, err
	}
	id := newID()
	sec, err := s.st.CreateSecret(ctx, store.Secret{ID: id, TeamID: teamID, Name: n, Metadata: metadata}, func(v int64) (string, error) {
		return s.sealer.Seal(value, versionContext(teamID, id, v))
	})
	if errors.Is(err, store.ErrConflict) {
		return store.Secret{}, fmt.Errorf("%w: %q", ErrConflict, n)
	}
	if errors.Is(err, store.ErrSecretLimit) {
		return store.Secret{}, fmt.Errorf("%w: at most %d secrets per team", ErrLimit, store.MaxSecretsPerTeam)
	}
	return sec, err
}

// Update makes value the secret's new current version; metadata, if not
// nil, replaces the secret's.
func (s *Service) Update(ctx context.Context, teamID, ref, value string, metadata map[string]string) (store.Secret, error) {
	if err := checkValue(value); err != nil {
		return store.Secret{}, err
	}
	if metadata != nil {
		if err := checkMetadata(metadata); err != nil {
			return store.Secret{}, err
		}
	}
	cur, err := s.Get(ctx, teamID, ref)
	if err != nil {
		return store.Secret{}, err
	}
	sec, err := s.st.AddSecretVersion(ctx, teamID, cur.ID, func(v int64) (string, error) {
		return s.sealer.Seal(value, versionContext(teamID, cur.ID, v))
	}, metadata)
	if errors.Is(err, store.ErrNotFound) {
		return store.Secret{}, fmt.Errorf("%w: %s", ErrNotFound, ref)
	}
	s.forget(teamID, cur.Name)
	return sec, err
}

// Get finds a team's secret by ID or name.
func (s *Service) Get(ctx context.Context, teamID, ref string) (store.Secret, error) {
	if teamID == "" {
		return store.Secret{}, errors.New("secret: a team is required")
	}
	key := ref
	if !strings.HasPrefix(ref, "sec_") {
		key = strings.ToLower(ref)
	}
	sec, err := s.st.GetSecret(ctx, teamID, key)
	if errors.Is(err, store.ErrNotFound) {
		return store.Secret{}, fmt.Errorf("%w: %s", ErrNotFound, ref)
	}
	return sec, err
}

// List returns up to limit of a team's secrets after the cursor.
func (s *Service) List(ctx context.Context, teamID string, after *store.SecretCursor, limit int) ([]store.Secret, error) {
	return s.st.ListSecrets(ctx, teamID, after, limit)
}

// Delete removes a team's secret and all its versions.
func (s *Service) Delete(ctx context.Context, teamID, ref string) error {
	cur, err := s.Get(ctx, teamID, ref)
	if err != nil {
		return err
	}
	if err := s.st.DeleteSecret(ctx, teamID, cur.ID); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("%w: %s", ErrNotFound, ref)
		}
		return err
	}
	s.forget(teamID, cur.Name)
	return nil
}

// Resolve returns the current value of a team's secret by name: what the
// egress proxy puts into a request. Values are cached for CacheTTL.
func (s *Service) Resolve(ctx context.Context, teamID, name string) (string, error) {
	if teamID == "" {
		return "", errors.New("secret: a team is required")
	}
	key := teamID + "/" + name
	s.mu.Lock()
	if c, ok := s.cache[key]; ok && time.Now().Before(c.until) {
		s.mu.Unlock()
		return c.value, nil
	}
	s.mu.Unlock()
	sec, sealed, err := s.st.SecretValue(ctx, teamID, name)
	if errors.Is(err, store.ErrNotFound) {
		return "", fmt.Errorf("%w: the team has no secret %q", ErrNotFound, name)
	}
	if err != nil {
		return "", err
	}
	v, err := s.sealer.Open(sealed, versionContext(teamID, sec.ID, sec.CurrentVersion))
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	if len(s.cache) > 4096 {
		clear(s.cache)
	}
	s.cache[key] = cached{value: v, until: time.Now().Add(CacheTTL)}
	s.mu.Unlock()
	return v, nil
}

func (s *Service) forget(teamID, name string) {
	s.mu.Lock()
	delete(s.cache, teamID+"/"+name)
	s.mu.Unlock()
}

func checkValue(v string) error {
	if v == "" {
		return fmt.Errorf("%w: the value is empty", ErrInvalid)
	}
	if len(v) > MaxValueBytes {
		return fmt.Errorf("%w: the value is larger than %d bytes", ErrInvalid, MaxValueBytes)
	}
	return nil
}

func checkMetadata(m map[string]string) error {
	if len(m) > MaxMetadataPairs {
		return fmt.Errorf("%w: metadata has %d entries, at most %d are allowed", ErrInvalid, len(m), MaxMetadataPairs)
	}
	total := 0
	for k, v := range m {
		if k == "" || len(k) > maxMetaKey || len(v) > maxMetaValue {
			return fmt.Errorf("%w: metadata keys have 1-%d bytes and values at most %d", ErrInvalid, maxMetaKey, maxMetaValue)
		}
		total += len(k) + len(v)
	}
	if total > maxMetaTotal {
		return fmt.Errorf("%w: metadata is larger than %d bytes", ErrInvalid, maxMetaTotal)
	}
	return nil
}

// newID returns a secret ID: "sec_" and 20 lower-case letters and digits.
func newID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return "sec_" + string(b)
}
