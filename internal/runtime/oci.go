package runtime

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/warren-sandbox/warren/internal/envdinfo"
)

// ociOptions are the differences between backends in the OCI spec.
type ociOptions struct {
	// cgroupNS gives the sandbox its own cgroup namespace (runc). gVisor
	// shows the guest its own emulated cgroupfs, so runsc needs none.
	cgroupNS bool
	// maskHost masks and write-protects host kernel files under /proc and
	// /sys (runc). gVisor's /proc and /sys are synthetic and expose
	// nothing of the host.
	maskHost bool
	// seccomp filters the sandbox's system calls (runc: see
	// sandboxSeccomp). gVisor's sentry is the sandbox's kernel and
	// filters its own host system calls, so runsc gets none.
	seccomp *specs.LinuxSeccomp
	// pidsLimit is written to the host pids cgroup; <= 0 means no limit.
	pidsLimit int64
	// diskTmp mounts the root filesystem's own /tmp at /tmp (runsc).
	// gVisor otherwise puts an internal tmpfs over an empty /tmp: files
	// written there would live in memory, escape the disk limit, vanish
	// from template builds' layers and differ from E2B, where /tmp is on
	// the sandbox's disk.
	diskTmp bool
}

// defaultPath is envd's PATH when the caller sets none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// sandboxCaps are the capabilities of envd, and through it of root in the
// sandbox and of sudo. The set is Docker's default set (what images and
// tools expect from "root in a container"): enough for package managers
// (CHOWN, DAC_OVERRIDE, FOWNER, FSETID, SETFCAP, MKNOD), for sudo and su
// (SETUID, SETGID, SETPCAP, AUDIT_WRITE), chroot builds (SYS_CHROOT), ping
// (NET_RAW), low ports (NET_BIND_SERVICE) and kill. Left out on purpose:
// SYS_ADMIN (mount, namespaces), SYS_PTRACE, NET_ADMIN, SYS_MODULE,
// SYS_TIME, SYS_RAWIO and the rest: they reach host kernel surfaces a
// sandbox user has no business with.
var sandboxCaps = []string{
	"CAP_AUDIT_WRITE",
	"CAP_CHOWN",
	"CAP_DAC_OVERRIDE",
	"CAP_FOWNER",
	"CAP_FSETID",
	"CAP_KILL",
	"CAP_MKNOD",
	"CAP_NET_BIND_SERVICE",
	"CAP_NET_RAW",
	"CAP_SETFCAP",
	"CAP_SETGID",
	"CAP_SETPCAP",
	"CAP_SETUID",
	"CAP_SYS_CHROOT",
}

// maskedPaths and readonlyPaths hide host kernel knobs that /proc and /sys
// expose even inside namespaces: runc's default lists (`runc spec`) plus
// Docker's additions (/proc/interrupts, powercap's energy counters).
var (
	maskedPaths = []string{
		"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/sched_debug", "/proc/scsi", "/proc/timer_list",
		"/proc/timer_stats", "/sys/devices/virtual/powercap", "/sys/firmware",
	}
	readonlyPaths = []string{
		"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
	}
)

// buildOCI turns a Spec into the OCI runtime spec both backends read.
func buildOCI(s *Spec, cfg *Config, o ociOptions) *specs.Spec {
	hostname := s.Hostname
	if hostname == "" {
		hostname = s.ID
	}
	return &specs.Spec{
		Version:  specs.Version,
		Root:     &specs.Root{Path: s.RootFS},
		Hostname: hostname,
		Process:  buildProcess(s, cfg),
		Mounts:   buildMounts(s, o),
		Linux:    buildLinux(s, cfg, o),
	}
}

func buildProcess(s *Spec, cfg *Config) *specs.Process {
	caps := append([]string(nil), sandboxCaps...)
	soft := cfg.NoFile
	if soft > maxSoftNoFile {
		soft = maxSoftNoFile
	}
	return &specs.Process{
		User: specs.User{UID: 0, GID: 0},
		Args: append([]string{EnvdMountPath}, s.Args...),
		Env:  buildEnv(s),
		Cwd:  "/",
		Capabilities: &specs.LinuxCapabilities{
			Bounding:  caps,
			Effective: caps,
			Permitted: caps,
		},
		Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: cfg.NoFile, Soft: soft}},
		// no_new_privs stays off: with it the kernel ignores setuid bits,
		// and E2B sandboxes promise the user passwordless sudo (templates
		// and SDK users run `sudo apt-get ...`). It would buy nothing
		// here: the most a setuid binary can reach is root with the
		// bounding set above, which envd and sudo give anyway, and
		// runc's seccomp filter (installed by runc itself, which needs no
		// no_new_privs for that) is inherited by everything, setuid or
		// not, and cannot be removed.
		NoNewPrivileges: false,
	}
}

func buildEnv(s *Spec) []string {
	env := make([]string, 0, len(s.Env)+2)
	hasPath := false
	for _, kv := range s.Env {
		if strings.HasPrefix(kv, "PATH=") {
			hasPath = true
		}
		if strings.HasPrefix(kv, envdinfo.AccessTokenEnv+"=") && s.AccessToken != "" {
			continue // the explicit field wins
		}
		env = append(env, kv)
	}
	if !hasPath {
		env = append([]string{"PATH=" + defaultPath}, env...)
	}
	if s.AccessToken != "" {
		env = append(env, envdinfo.AccessTokenEnv+"="+s.AccessToken)
	}
	return env
}

func buildMounts(s *Spec, o ociOptions) []specs.Mount {
	ms := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		// No size: tmpfs pages are charged to the sandbox's memory cgroup,
		// which is the real bound. A per-sandbox size would also make the
		// mount options differ between a checkpoint and its restores.
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
		bind(s.EnvdPath, EnvdMountPath, true),
	}
	if s.ResolvConf != "" {
		ms = append(ms, bind(s.ResolvConf, "/etc/resolv.conf", true))
	}
	if s.Hosts != "" {
		ms = append(ms, bind(s.Hosts, "/etc/hosts", true))
	}
	if o.diskTmp {
		// Only a real directory: the rootfs comes from images, and a
		// symlink there would be followed on the host.
		tmp := filepath.Join(s.RootFS, "tmp")
		if fi, err := os.Lstat(tmp); err == nil && fi.IsDir() {
			ms = append(ms, specs.Mount{Destination: "/tmp", Type: "bind", Source: tmp, Options: []string{"rbind", "rw"}})
		}
	}
	for _, m := range s.Mounts {
		ms = append(ms, bind(m.Source, path.Clean(m.Destination), m.ReadOnly))
	}
	return ms
}

func bind(src, dst string, ro bool) specs.Mount {
	mode := "rw"
	if ro {
		mode = "ro"
	}
	return specs.Mount{Destination: dst, Type: "bind", Source: src, Options: []string{"rbind", mode, "nosuid", "nodev"}}
}

func buildLinux(s *Spec, cfg *Config, o ociOptions) *specs.Linux {
	ns := []specs.LinuxNamespace{
		{Type: specs.PIDNamespace},
		{Type: specs.IPCNamespace},
		{Type: specs.UTSNamespace},
		{Type: specs.MountNamespace},
		{Type: specs.NetworkNamespace, Path: s.NetNSPath},
	}
	if o.cgroupNS {
		ns = append(ns, specs.LinuxNamespace{Type: specs.CgroupNamespace})
	}
	l := &specs.Linux{
		Namespaces:  ns,
		CgroupsPath: cgroupPath(cfg, s.ID),
		Resources:   buildResources(s, o),
	}
	if o.maskHost {
		l.MaskedPaths = maskedPaths
		l.ReadonlyPaths = readonlyPaths
	}
	l.Seccomp = o.seccomp
	return l
}

// sandboxSeccomp is the seccomp profile of runc sandboxes: Docker's
// default profile (github.com/moby/profiles/seccomp), maintained with the
// kernel, resolved for sandboxCaps. It refuses with EPERM what a sandbox
// with these capabilities has no business calling but that the kernel
// would otherwise allow without privileges: new user namespaces (unshare,
// clone flags), the kernel keyring, bpf, userfaultfd, perf, kexec,
// module and clock calls, exotic socket families and the like.
func sandboxSeccomp() (*specs.LinuxSeccomp, error) {
	prof, err := seccomp.GetDefaultProfile(&specs.Spec{Process: &specs.Process{
		Capabilities: &specs.LinuxCapabilities{Bounding: sandboxCaps},
	}})
	if err != nil {
		return nil, fmt.Errorf("runtime: the default seccomp profile: %w", err)
	}
	return prof, nil
}

// cpuPeriod is the CFS period; the quota is cpuCount periods.
const cpuPeriod = 100000

// A background sandbox's CPU weight is an eighth of the kernel's default
// (cgroup v1 cpu.shares; runsc turns it into cgroup v2's cpu.weight):
// low enough that a warm pool's refill (a runsc start, ~100 ms of CPU)
// does not slow the commands of the sandbox just handed out, high enough
// that it still starts in seconds on a node whose CPUs are all busy.
// Foreground sets the defaults back.
const (
	backgroundShares = 128
	defaultShares    = 1024 // cgroup v1 cpu.shares
	defaultWeight    = 100  // cgroup v2 cpu.weight
)

func buildResources(s *Spec, o ociOptions) *specs.LinuxResources {
	r := &specs.LinuxResources{
		// Deny every device; the runtimes add the standard safe set
		// (null, zero, full, random, urandom, tty, ptmx) themselves.
		Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
	}
	if s.CPUCount > 0 {
		period := uint64(cpuPeriod)
		quota := int64(s.CPUCount) * cpuPeriod
		r.CPU = &specs.LinuxCPU{Period: &period, Quota: &quota}
	}
	if s.Background {
		shares := uint64(backgroundShares)
		if r.CPU == nil {
			r.CPU = &specs.LinuxCPU{}
		}
		r.CPU.Shares = &shares
	}
	if s.MemoryMB > 0 {
		limit := int64(s.MemoryMB) << 20
		swap := limit // memory+swap = memory: no swap
		r.Memory = &specs.LinuxMemory{Limit: &limit, Swap: &swap}
	}
	if o.pidsLimit > 0 {
		limit := o.pidsLimit
		r.Pids = &specs.LinuxPids{Limit: &limit}
	}
	r.BlockIO = blockIO(s)
	return r
}

func cgroupPath(cfg *Config, id string) string { return path.Join(cfg.CgroupParent, id) }
