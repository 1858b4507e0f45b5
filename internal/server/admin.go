package server

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/warren-sandbox/warren/internal/dashboard"
	"github.com/warren-sandbox/warren/internal/envdinfo"
	"github.com/warren-sandbox/warren/internal/store"
)

// AdminTokenPrefix starts an admin token.
const AdminTokenPrefix = "wadm_"

// adminTokenFile is where a data dir keeps the admin token.
func adminTokenFile(dataDir string) string { return filepath.Join(dataDir, "admin-token") }

// AdminToken reads the data dir's admin token, making one (random, 256
// bits, mode 0600) on first use: the credential of the dashboard's
// nodes page on --admin-addr, no team's.
func AdminToken(dataDir string) (string, error) {
	file := adminTokenFile(dataDir)
	b, err := os.ReadFile(file)
	if err == nil {
		tok := strings.TrimSpace(string(b))
		if !strings.HasPrefix(tok, AdminTokenPrefix) || len(tok) < len(AdminTokenPrefix)+32 {
			return "", fmt.Errorf("%s does not hold an admin token (%s…): remove it for a new one", file, AdminTokenPrefix)
		}
		return tok, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	tok := AdminTokenPrefix + hex.EncodeToString(raw)
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	if _, err := f.WriteString(tok + "\n"); err != nil {
		f.Close()
		return "", err
	}
	return tok, f.Close()
}

// listenAdmin listens on --admin-addr, if set: never the API's or the
// proxy's address, whose clients are tenants.
func listenAdmin(cfg Config) (net.Listener, error) {
	if cfg.AdminAddr == "" {
		return nil, nil
	}
	for _, a := range append([]string{cfg.APIAddr, cfg.ProxyAddr, cfg.MetricsAddr}, cfg.ProxyTLSAddrs...) {
		if a == cfg.AdminAddr && !strings.HasSuffix(a, ":0") { // ":0": a port of its own anyway
			return nil, fmt.Errorf("--admin-addr %s: the admin's dashboard gets a listener of its own, not the API's, the proxy's or the metrics'", cfg.AdminAddr)
		}
	}
	ln, err := net.Listen("tcp", cfg.AdminAddr)
	if err != nil {
		return nil, fmt.Errorf("--admin-addr: %w", err)
	}
	return ln, nil
}

// adminServer serves the dashboard with its admin door (the nodes page)
// on the admin's listener; team credentials sign in there too.
func adminServer(cfg Config, st store.Store, sealer dashboard.Sealer, apiSrv *http.Server, apiHandler, proxyHandler http.Handler) (*http.Server, error) {
	tok, err := AdminToken(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	// Its origin is its own address's (an operators' network), never the
	// API's --public-url.
	h := dashboard.New(dashboard.Config{API: apiHandler, Envd: proxyHandler, EnvdPort: envdinfo.Port, Store: st,
		Sessions: st, Sealer: sealer, Admin: &dashboard.AdminConfig{Token: tok, Nodes: st, LostAfter: cfg.LostAfter}})
	return &http.Server{Handler: h, ReadHeaderTimeout: apiSrv.ReadHeaderTimeout, ReadTimeout: apiSrv.ReadTimeout,
		WriteTimeout: apiSrv.WriteTimeout, IdleTimeout: apiSrv.IdleTimeout, MaxHeaderBytes: apiSrv.MaxHeaderBytes}, nil
}

// checkPublicURL validates --public-url: an origin (dashboard.ParsePublicURL),
// for a process that serves the dashboard.
func checkPublicURL(cfg Config) error {
	if cfg.PublicURL == "" {
		return nil
	}
	if cfg.Role == RoleNode {
		return errors.New("--public-url is for --role all or api: a node serves no dashboard")
	}
	_, err := dashboard.ParsePublicURL(cfg.PublicURL)
	return err
}
