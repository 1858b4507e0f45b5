// Package s3test starts a real S3-compatible server on loopback for
// tests: SeaweedFS (`weed mini`, Apache-2.0), built once by
// scripts/install-deps.sh into WeedPath. Not a fake: the tests talk to
// the same server code an operator may run.
//
// Why SeaweedFS: MinIO's server is AGPL-3.0; fakes (gofakes3) check
// nothing a real service does; SeaweedFS is a well-kept Apache-2.0 Go
// module served by the Go proxy, whose `weed mini` runs master, volume,
// filer and S3 gateway in one process bound to loopback, with its
// telemetry turned off here. Its build is heavy (~7 CPU-minutes, 25 min
// of wall time on a loaded 2-core box, a 230 MB binary), hence once, in
// install-deps.sh; a server starts in 2-3 s.
package s3test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/blobstore"
)

// WeedVersion is the SeaweedFS module version install-deps.sh builds.
const WeedVersion = "v0.0.0-20261109003541-7506e5f91cd6"

// WeedPath is where install-deps.sh puts the weed binary; $WARREN_WEED
// overrides it.
func WeedPath() string {
	if p := os.Getenv("WARREN_WEED"); p != "" {
		return p
	}
	return "/usr/local/lib/warren-test/weed-" + WeedVersion
}

// Server is a running SeaweedFS S3 gateway with one bucket.
type Server struct {
	// Endpoint is its S3 address, 127.0.0.1:PORT (plain HTTP).
	Endpoint string
	Bucket   string
	// AccessKey and SecretKey are the one identity it accepts.
	AccessKey, SecretKey string
	Dir                  string
	cmd                  *exec.Cmd
	exited               chan struct{} // closed once cmd has been waited for
}

// Config is a path-style blobstore.S3Config for the server's bucket
// under prefix.
func (s *Server) Config(prefix string) blobstore.S3Config {
	return blobstore.S3Config{
		Bucket: s.Bucket, Prefix: prefix, Endpoint: s.Endpoint, Insecure: true,
		Region: "us-east-1", PathStyle: true,
		AccessKey: s.AccessKey, SecretKey: blobstore.Secret(s.SecretKey),
		PartSize: 5 << 20, Concurrency: 4,
	}
}

// Start starts a server for the test, stopped at its cleanup. A missing
// binary fails the test (run scripts/install-deps.sh).
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := StartDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartDir starts a server keeping its data in dir.
func StartDir(dir string) (*Server, error) {
	bin := WeedPath()
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("s3test: no SeaweedFS binary at %s (run scripts/install-deps.sh): %v", bin, err)
	}
	s := &Server{Bucket: "warren-test", AccessKey: "warrentestkey", SecretKey: "warren-test-secret-" + strconv.Itoa(os.Getpid()), Dir: dir}
	conf := map[string]any{"identities": []any{map[string]any{
		"name":        "warren",
		"credentials": []any{map[string]string{"accessKey": s.AccessKey, "secretKey": s.SecretKey}},
		"actions":     []string{"Admin", "Read", "Write", "List", "Tagging"},
	}}}
	b, _ := json.Marshal(conf)
	confPath := filepath.Join(dir, "s3.json")
	if err := os.WriteFile(confPath, b, 0o600); err != nil {
		return nil, err
	}
	ports, err := freePorts(6)
	if err != nil {
		return nil, err
	}
	s.Endpoint = "127.0.0.1:" + strconv.Itoa(ports[0])
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		return nil, err
	}
	grpc := func(p int) string { return strconv.Itoa(p) }
	args := []string{"mini",
		"-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-dir=" + data,
		"-master.telemetry=false", // never call out of the machine
		"-webdav=false", "-admin.ui=false",
		"-s3.port=" + strconv.Itoa(ports[0]),
		"-master.port=" + strconv.Itoa(ports[1]), "-master.port.grpc=" + grpc(ports[1]+10000),
		"-filer.port=" + strconv.Itoa(ports[2]), "-filer.port.grpc=" + grpc(ports[2]+10000),
		"-volume.port=" + strconv.Itoa(ports[3]), "-volume.port.grpc=" + grpc(ports[3]+10000),
		"-s3.port.grpc=" + grpc(ports[0]+10000),
		"-s3.port.iceberg=0", "-s3.port.lance=0",
		"-admin.port=" + strconv.Itoa(ports[4]), "-admin.port.legacy=0",
		"-s3.config=" + confPath, "-bucket=" + s.Bucket,
		"-filer.localSocket=" + filepath.Join(dir, "filer.sock"),
		"-s3.localSocket=" + filepath.Join(dir, "s3.sock"),
		"-metricsPort=0", "-s3.iam=false",
	}
	log, err := os.Create(filepath.Join(dir, "weed.log"))
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), "HOME="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// Pdeathsig fires when the thread that forked the child ends, not the
	// test process, and Go ends a thread whose goroutine exits locked to
	// it (as helpers that enter a network namespace do): the server is
	// started and waited for by a goroutine locked to its thread for as
	// long as it lives (as test/security's seckit.StartProc does).
	started := make(chan error, 1)
	s.exited = make(chan struct{})
	go func() {
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(s.exited)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	s.cmd = cmd
	if err := s.waitReady(60 * time.Second); err != nil {
		s.Stop()
		logText, _ := os.ReadFile(filepath.Join(dir, "weed.log"))
		if len(logText) > 4000 {
			logText = logText[len(logText)-4000:]
		}
		return nil, fmt.Errorf("s3test: SeaweedFS did not come up: %v\n%s", err, logText)
	}
	return s, nil
}

// waitReady waits until the bucket answers through the S3 API.
func (s *Server) waitReady(d time.Duration) error {
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_, err := blobstore.NewS3(ctx, s.Config(""))
		cancel()
		if err == nil {
			return nil
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	return last
}

// Stop kills the server and its process group.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.exited
	s.cmd = nil
}

// freePorts picks n free loopback TCP ports whose +10000 (SeaweedFS's
// gRPC ports) are free too.
func freePorts(n int) ([]int, error) {
	var out []int
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for tries := 0; len(out) < n && tries < 200; tries++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		p := l.Addr().(*net.TCPAddr).Port
		if p+10000 > 65535 {
			l.Close()
			continue
		}
		g, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
		if err != nil {
			l.Close()
			continue
		}
		held = append(held, l, g)
		out = append(out, p)
	}
	if len(out) < n {
		return nil, fmt.Errorf("s3test: no free ports")
	}
	return out, nil
}
