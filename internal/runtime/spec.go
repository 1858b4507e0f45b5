package runtime

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
)

// Spec describes a sandbox to start or restore. Paths are host paths.
type Spec struct {
	// ID names the sandbox; see ValidID.
	ID string
	// RootFS is the root directory, usually an overlay mount the caller
	// made. It is mounted read-write.
	RootFS string
	// EnvdPath is the envd binary on the host, bind-mounted read-only at
	// EnvdMountPath and run as the sandbox's first process.
	EnvdPath string
	// Args are envd's arguments (without argv[0]).
	Args []string
	// Env is envd's environment, KEY=VALUE. PATH gets a default if absent.
	Env []string
	// AccessToken, if set, is passed in WARREN_ENVD_ACCESS_TOKEN, which
	// envd removes from its environment before starting anything.
	AccessToken string
	// NetNSPath is a network namespace the caller prepared (veth, address,
	// default route), e.g. /var/run/netns/<name>.
	NetNSPath string
	// Hostname is the sandbox's hostname. Default: the ID.
	Hostname string
	// ResolvConf and Hosts, if set, are bind-mounted read-only over
	// /etc/resolv.conf and /etc/hosts. Read-only because the file may be
	// shared between sandboxes.
	ResolvConf string
	Hosts      string
	// LogPath, if set, is the file envd's stdout and stderr are appended
	// to, created if missing; it must not be a symbolic link. The caller
	// owns it, and should put it where the sandbox's writes are bounded
	// (root in a sandbox can reopen its envd's stdout and fill the file).
	// Default: Runtime.LogPath(ID) in the runtime's state dir.
	LogPath string
	// Mounts are extra bind mounts (volumes).
	Mounts []Mount
	// CPUCount limits CPU time to CPUCount cores (CFS quota); 0: no limit.
	CPUCount int
	// MemoryMB limits memory (and memory+swap to the same value); 0: no
	// limit.
	MemoryMB int
	// PidsLimit limits tasks; 0: Config.PidsLimit; negative: no limit.
	PidsLimit int64
	// Background starts the sandbox with a low CPU weight, so that it
	// yields the CPU to the sandboxes in use: a warm pool's sandbox,
	// started ahead of a create, until Runtime.Foreground.
	Background bool
	// DiskIO bounds the sandbox's IO on DiskDevice, the block device of
	// its disk (see diskio.go); a zero DiskDevice or DiskIO: no bound.
	DiskIO     DiskIO
	DiskDevice Device
}

// Mount is a bind mount from the host into the sandbox.
type Mount struct {
	Source      string
	Destination string
	ReadOnly    bool
}

// EnvdMountPath is where envd appears inside every sandbox.
const EnvdMountPath = "/opt/warren/envd"

// idPattern is narrower than what runc and runsc accept: IDs end up in
// file names, cgroup paths and runsc's state-file glob patterns.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// ValidID reports whether id can name a sandbox: 1–128 characters from
// [A-Za-z0-9_.-], starting with a letter or digit.
func ValidID(id string) bool { return idPattern.MatchString(id) }

func (s *Spec) validate() error {
	if !ValidID(s.ID) {
		return fmt.Errorf("runtime: invalid sandbox id %q", s.ID)
	}
	for name, p := range map[string]string{"RootFS": s.RootFS, "EnvdPath": s.EnvdPath, "NetNSPath": s.NetNSPath} {
		if p == "" {
			return fmt.Errorf("runtime: sandbox %s: %s is required", s.ID, name)
		}
		if !filepath.IsAbs(p) {
			return fmt.Errorf("runtime: sandbox %s: %s %q is not absolute", s.ID, name, p)
		}
	}
	if s.LogPath != "" && !filepath.IsAbs(s.LogPath) {
		return fmt.Errorf("runtime: sandbox %s: LogPath %q is not absolute", s.ID, s.LogPath)
	}
	for _, m := range s.Mounts {
		if !filepath.IsAbs(m.Source) || !filepath.IsAbs(m.Destination) {
			return fmt.Errorf("runtime: sandbox %s: mount %q -> %q: paths must be absolute", s.ID, m.Source, m.Destination)
		}
	}
	for _, kv := range s.Env {
		if !strings.Contains(kv, "=") {
			return fmt.Errorf("runtime: sandbox %s: env entry %q is not KEY=VALUE", s.ID, kv)
		}
	}
	if s.CPUCount < 0 || s.MemoryMB < 0 {
		return fmt.Errorf("runtime: sandbox %s: negative CPUCount or MemoryMB", s.ID)
	}
	return nil
}
