package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"time"

	"github.com/warren-sandbox/warren/internal/codeinterp"
	"github.com/warren-sandbox/warren/internal/envd/reaper"
	"github.com/warren-sandbox/warren/internal/envd/settings"
	"github.com/warren-sandbox/warren/internal/envd/users"
)

// startCodeInterpreter serves the code interpreter on port 49999 when the
// image asks for it (codeinterp.MarkerPath), and starts its default Python
// kernel at once. It returns a stop function; nil, nil when not asked for.
func startCodeInterpreter(s *settings.Settings, r *reaper.Reaper, log *slog.Logger) (func(), error) {
	if _, err := os.Stat(codeinterp.MarkerPath); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	u, err := users.Lookup(s.DefaultUser())
	if err != nil {
		return nil, fmt.Errorf("code interpreter: %w", err)
	}
	ci, err := codeinterp.New(codeinterp.Config{
		User:      u,
		Env:       s.EnvVars,
		Authorize: func(tok string) bool { return s.Open() || s.TokenMatches(tok) },
		Start: func(cmd *exec.Cmd) (int, <-chan struct{}, error) {
			pid, status, err := r.StartCmd(cmd)
			if err != nil {
				return 0, nil, err
			}
			done := make(chan struct{})
			go func() { <-status; close(done) }()
			return pid, done, nil
		},
		RunDir: codeinterp.RunDir,
		Log:    log,
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", codeinterp.Port))
	if err != nil {
		ci.Close()
		return nil, fmt.Errorf("code interpreter: %w", err)
	}
	hs := &http.Server{Handler: ci, ReadHeaderTimeout: 30 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	go func() {
		if err := ci.StartDefault(); err != nil {
			log.Error("code interpreter: starting the default Python kernel", "err", err)
			return
		}
		// Root's, in root's run dir: what a start snapshot waits for.
		if err := os.WriteFile(codeinterp.DefaultReadyPath, nil, 0o644); err != nil {
			log.Error("code interpreter: marking the default kernel ready", "err", err)
		}
	}()
	log.Info("code interpreter listening", "addr", ln.Addr().String())
	return func() { hs.Close(); ci.Close() }, nil
}
