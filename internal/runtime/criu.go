package runtime

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"time"
)

// CRIU 4.2 is the first release that works on current kernels: older ones
// fail on the vDSO layout of kernels >= 6.13 and on any TCP socket with
// kernels >= 6.16 (see runtime-facts.md). Debian 12 ships 3.17.
const criuMinMajor, criuMinMinor = 4, 2

// errRuncNoCheckpoint is the error of every runc checkpoint/restore call on
// a host without a usable CRIU.
var errRuncNoCheckpoint = fmt.Errorf("checkpoint/restore is %w by the runc runtime on this host: CRIU >= %d.%d is required", ErrNotSupported, criuMinMajor, criuMinMinor)

var criuVersionRE = regexp.MustCompile(`(?m)^Version:\s*(\d+)\.(\d+)(?:\.(\d+))?`)

// criuStatus finds CRIU (name is a path or a name looked up on PATH) and
// tells whether it is recent enough. path is empty when none was found;
// detail is a sentence for Capabilities.
func criuStatus(name string) (path string, ok bool, detail string) {
	if name == "" {
		name = "criu"
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", false, fmt.Sprintf("no CRIU found (%s); CRIU >= %d.%d is required", name, criuMinMajor, criuMinMinor)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, p, "--version").Output()
	if err != nil {
		return p, false, fmt.Sprintf("%s --version failed: %v", p, err)
	}
	major, minor, ok := parseCriuVersion(string(out))
	if !ok {
		return p, false, fmt.Sprintf("%s: cannot parse its version from %q", p, out)
	}
	if major < criuMinMajor || major == criuMinMajor && minor < criuMinMinor {
		return p, false, fmt.Sprintf("%s is CRIU %d.%d; CRIU >= %d.%d is required", p, major, minor, criuMinMajor, criuMinMinor)
	}
	return p, true, fmt.Sprintf("%s is CRIU %d.%d", p, major, minor)
}

// parseCriuVersion reads `criu --version` output ("Version: 4.2.1").
func parseCriuVersion(out string) (major, minor int, ok bool) {
	m := criuVersionRE.FindStringSubmatch(out)
	if m == nil {
		return 0, 0, false
	}
	major, _ = strconv.Atoi(m[1])
	minor, _ = strconv.Atoi(m[2])
	return major, minor, true
}
