// Command envd is the daemon inside every Warren sandbox. It serves E2B's
// Connect services and /files on port 49983.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/warren-sandbox/warren/internal/envd"
	"github.com/warren-sandbox/warren/internal/envd/reaper"
	"github.com/warren-sandbox/warren/internal/envd/settings"
	"github.com/warren-sandbox/warren/internal/envdinfo"
)

func main() {
	addr := flag.String("addr", fmt.Sprintf("0.0.0.0:%d", envdinfo.Port), "listen address; several may be given, comma-separated")
	user := flag.String("user", "user", "default user for requests that name none")
	workdir := flag.String("workdir", "", "default working directory (default: the user's home)")
	version := flag.Bool("version", false, "print the version and exit")
	insecure := flag.Bool("insecure-no-token", false, "serve every request without a token while none is set (development only: anyone who reaches the port can run anything as root)")
	flag.Parse()
	if *version {
		fmt.Println(envdinfo.Version)
		return
	}
	// One JSON object per line: the platform parses envd.log into E2B's
	// SandboxLogEntry records (time, level, msg, the rest as fields).
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	token := os.Getenv(envdinfo.AccessTokenEnv)
	os.Unsetenv(envdinfo.AccessTokenEnv) // at once, so that no sandbox process inherits it
	s := settings.New(*user, *workdir, token)
	switch {
	case token == "" && *insecure:
		s.AllowNoToken()
		log.Warn("no access token and --insecure-no-token: every request is served unauthenticated")
	case token == "":
		log.Warn("no access token (" + envdinfo.AccessTokenEnv + "): every request but GET /health is refused")
	}
	if err := run(*addr, s, log); err != nil {
		log.Error("envd failed", "err", err)
		os.Exit(1)
	}
}

func run(addr string, s *settings.Settings, log *slog.Logger) error {
	r, err := reaper.Start()
	if err != nil {
		return fmt.Errorf("becoming the subreaper: %w", err)
	}
	srv := envd.New(s, r, log)
	defer srv.Close()
	srv.Processes().SetLogger(log)
	if stop, err := startCodeInterpreter(s, r, log); err != nil {
		log.Error("code interpreter not started", "err", err)
	} else if stop != nil {
		defer stop()
	}

	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 30 * time.Second}
	addrs := strings.Split(addr, ",")
	errc := make(chan error, len(addrs))
	for _, a := range addrs {
		ln, err := net.Listen("tcp", strings.TrimSpace(a))
		if err != nil {
			return err
		}
		go func() { errc <- hs.Serve(ln) }()
		log.Info("envd listening", "addr", ln.Addr().String(), "version", envdinfo.Version)
	}

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	select {
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	case sig := <-sigs:
		// As PID 1, pass the signal on to every process we run, then stop.
		log.Info("signal received, shutting down", "signal", sig.String())
		srv.Processes().SignalAll(sig.(syscall.Signal))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return hs.Shutdown(ctx)
	}
}
