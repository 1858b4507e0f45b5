package mcpgateway

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The SDK waits for `mcp-gateway --config` to exit (commands.run, 60 s by
// default) and fails the create on a non-zero exit with its stderr. So
// the command starts the gateway as a daemon of its own session, waits
// until it serves (or failed), and exits: startTimeout leaves the SDK's
// default room.
const startTimeout = 50 * time.Second

// LogPath is the gateway's log: the servers' stderr and install output.
const LogPath = "/var/log/mcp-gateway.log"

// ServersUser is who the servers run as.
const ServersUser = "user"

// startup is what the command hands the daemon on its fd 3.
type startup struct {
	Config json.RawMessage `json:"config"`
	Token  string          `json:"token"`
}

// Main is the mcp-gateway command; it returns the exit code.
//
//	mcp-gateway --config '<json>'   start the gateway (as the SDK does)
//	mcp-gateway pull <server>...    what Template.addMcpServer runs: refused
func Main(args []string, stderr io.Writer) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "mcp-gateway: "+format+"\n", a...)
		return 1
	}
	switch {
	case len(args) == 2 && args[0] == "--config":
		if err := launch([]byte(args[1])); err != nil {
			return fail("%v", err)
		}
		fmt.Fprintf(stderr, "mcp-gateway: serving on port %d at /mcp\n", Port)
		return 0
	case len(args) == 1 && args[0] == "serve":
		if err := serveDaemon(); err != nil {
			return fail("%v", err)
		}
		return 0
	case len(args) >= 1 && args[0] == "pull":
		return fail("cannot pull %v: %s", args[1:], supported)
	default:
		return fail("usage: mcp-gateway --config '<json>' (GATEWAY_ACCESS_TOKEN in the environment)")
	}
}

// launch checks the config, starts the daemon and waits for its report.
func launch(config []byte) error {
	if _, err := ParseConfig(config); err != nil {
		return err
	}
	token := os.Getenv("GATEWAY_ACCESS_TOKEN")
	if token == "" {
		b := make([]byte, 24)
		rand.Read(b)
		token = hex.EncodeToString(b)
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(LogPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return err
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd := exec.Command(exe, "serve")
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{cfgR, readyW}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	cfgR.Close()
	readyW.Close()
	if err != nil {
		cfgW.Close()
		readyR.Close()
		return err
	}
	go cmd.Wait() // reaped if it dies while we wait
	b, _ := json.Marshal(startup{Config: config, Token: token})
	cfgW.Write(b)
	cfgW.Close()

	report := make(chan string, 1)
	go func() {
		msg, _ := io.ReadAll(io.LimitReader(readyR, 64<<10))
		report <- string(msg)
	}()
	select {
	case msg := <-report:
		readyR.Close()
		if msg == "ok" {
			return nil
		}
		cmd.Process.Kill()
		if msg == "" {
			return fmt.Errorf("the gateway died while starting (see %s)", LogPath)
		}
		return errors.New(msg)
	case <-time.After(startTimeout):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		return fmt.Errorf("the gateway did not start its servers within %v (see %s)", startTimeout, LogPath)
	}
}

// serveDaemon is the daemon: it reads its startup from fd 3, reports
// "ok" or the error on fd 4, and serves until SIGTERM.
func serveDaemon() error {
	// The servers must not inherit these: a server holding fd 4 would
	// keep the command waiting for its end.
	for _, fd := range []int{3, 4} {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			return errors.New("serve is started by mcp-gateway --config")
		}
		syscall.CloseOnExec(fd)
	}
	in, ready := os.NewFile(3, "startup"), os.NewFile(4, "ready")
	report := func(err error) error {
		msg := "ok"
		if err != nil {
			msg = err.Error()
		}
		ready.WriteString(msg)
		ready.Close()
		return err
	}
	var st startup
	if err := json.NewDecoder(io.LimitReader(in, 2*MaxConfigBytes)).Decode(&st); err != nil {
		return report(fmt.Errorf("reading the startup: %v", err))
	}
	in.Close()
	servers, err := ParseConfig(st.Config)
	if err != nil {
		return report(err)
	}
	opts, err := serversAccount()
	if err != nil {
		return report(err)
	}
	opts.Servers, opts.Token, opts.Logs = servers, st.Token, os.Stderr
	opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))

	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", Port))
	if err != nil {
		return report(fmt.Errorf("port %d: %v (is a gateway running already?)", Port, err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout-5*time.Second)
	g, err := Start(ctx, opts)
	cancel()
	if err != nil {
		ln.Close()
		return report(err)
	}
	defer g.Close()
	if err := writeToken(TokenPath, st.Token); err != nil {
		return report(err)
	}
	srv := &http.Server{Handler: g.Handler(), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	report(nil)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(ctx)
	case err := <-done:
		return err
	}
}

// serversAccount is who the servers run as: ServersUser when the gateway
// is root (as the SDK starts it) and that account exists, else the
// gateway's own.
func serversAccount() (Options, error) {
	u, err := user.Lookup(ServersUser)
	if os.Getuid() != 0 || err != nil {
		if os.Getuid() == 0 {
			return Options{}, fmt.Errorf("the servers' account %q: %v", ServersUser, err)
		}
		home, _ := os.UserHomeDir()
		return Options{Home: home, BaseEnv: os.Environ()}, nil
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return Options{
		Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)},
		Home:       u.HomeDir,
		BaseEnv: []string{
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"HOME=" + u.HomeDir, "USER=" + u.Username, "LOGNAME=" + u.Username,
			"LANG=C.UTF-8",
		},
	}, nil
}

// writeToken writes the token, readable by root only, whole or not at all.
func writeToken(path, token string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	w.WriteString(token)
	if err := errors.Join(w.Flush(), f.Close()); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
