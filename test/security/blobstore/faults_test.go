package blobstore

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// The nodes of the crash tests run a build of warren with the fault
// points (-tags warren_faults, internal/sandbox/faults_on.go); the
// production build, bin/warren, has none. It is built once per run of the
// package, from go's build cache after the first.
var faultsBuild struct {
	once sync.Once
	dir  string
	bin  string
	err  error
	out  []byte
	took time.Duration
}

func faultsBinary(t testing.TB, repo string) string {
	t.Helper()
	faultsBuild.once.Do(func() {
		if faultsBuild.dir, faultsBuild.err = os.MkdirTemp("", "warren-faults-"); faultsBuild.err != nil {
			return
		}
		faultsBuild.bin = filepath.Join(faultsBuild.dir, "warren")
		cmd := exec.Command("go", "build", "-tags", "warren_faults", "-o", faultsBuild.bin, "./cmd/warren")
		cmd.Dir = repo
		start := time.Now()
		faultsBuild.out, faultsBuild.err = cmd.CombinedOutput()
		faultsBuild.took = time.Since(start)
	})
	if faultsBuild.err != nil {
		t.Fatalf("building warren with the fault points: %v: %s", faultsBuild.err, faultsBuild.out)
	}
	t.Logf("warren with the fault points: %s (built in %s)", faultsBuild.bin, faultsBuild.took.Round(time.Millisecond))
	return faultsBuild.bin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if faultsBuild.dir != "" {
		os.RemoveAll(faultsBuild.dir)
	}
	os.Exit(code)
}
