package runtime

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Config configures a backend. The zero value gives the defaults below.
type Config struct {
	// Binary is the runtime executable. Default: DefaultRunscPath for
	// runsc, "runc" looked up on PATH for runc.
	Binary string
	// StateDir holds the runtime's state (its --root) and one directory
	// per sandbox (bundle, logs). Default: /run/warren/<backend>. It is on
	// tmpfs by default because runtime state does not survive a reboot
	// anyway, and the sandboxes don't either.
	StateDir string
	// CgroupParent is the cgroup under which every sandbox gets its own
	// <CgroupParent>/<id>, in every hierarchy. Default: /warren.
	CgroupParent string
	// PidsLimit is the default task limit of a sandbox when Spec.PidsLimit
	// is 0. Default: 1024.
	PidsLimit int64
	// NoFile is RLIMIT_NOFILE (hard) for envd and what it starts; the soft
	// limit is min(NoFile, 65536) so that programs that close every fd up
	// to the soft limit stay fast. Default: 1048576 (the kernel's nr_open
	// default).
	NoFile uint64
	// CommandTimeout bounds every call of the runtime binary, on top of the
	// caller's context. Default: 60s (restoring a large image from a cold
	// page cache takes seconds; a hung runtime must not hang us).
	CommandTimeout time.Duration
	// CriuPath is the CRIU binary runc uses (runc only). Default: "criu"
	// looked up on PATH.
	CriuPath string
	// Debug turns on the runtime's debug logging into the per-sandbox log
	// directory. It is verbose and slows runsc down.
	Debug bool
	// RunscFlags are global runsc flags (each "--name=value") given after
	// Warren's own, which they override: for measuring runsc's options
	// (scripts/runsc-options.sh). Warren's flags are chosen for its design
	// (runsc.go says why); overriding them may break it.
	RunscFlags []string
}

// DefaultRunscPath is where `warren setup` (EnsureRunsc) installs runsc.
const DefaultRunscPath = "/var/lib/warren/bin/runsc"

const (
	defaultCgroupParent   = "/warren"
	defaultPidsLimit      = 1024
	defaultNoFile         = 1 << 20
	maxSoftNoFile         = 65536
	defaultCommandTimeout = 60 * time.Second
)

func (c Config) withDefaults(backend string) (Config, error) {
	if c.StateDir == "" {
		c.StateDir = filepath.Join("/run/warren", backend)
	}
	if !filepath.IsAbs(c.StateDir) {
		return c, fmt.Errorf("runtime: StateDir %q is not absolute", c.StateDir)
	}
	if c.CgroupParent == "" {
		c.CgroupParent = defaultCgroupParent
	}
	if !filepath.IsAbs(c.CgroupParent) {
		return c, fmt.Errorf("runtime: CgroupParent %q is not absolute", c.CgroupParent)
	}
	c.CgroupParent = filepath.Clean(c.CgroupParent)
	if c.PidsLimit == 0 {
		c.PidsLimit = defaultPidsLimit
	}
	if c.NoFile == 0 {
		c.NoFile = defaultNoFile
	}
	c.NoFile = clampNoFile(c.NoFile)
	if c.CommandTimeout <= 0 {
		c.CommandTimeout = defaultCommandTimeout
	}
	for _, f := range c.RunscFlags {
		if !strings.HasPrefix(f, "--") || strings.ContainsAny(f, " \t\n") {
			return c, fmt.Errorf("runtime: runsc flag %q is not one --name[=value] argument", f)
		}
	}
	return c, nil
}

// clampNoFile lowers n to our own hard RLIMIT_NOFILE when we could not
// raise a limit past it: without CAP_SYS_RESOURCE (some hosts drop it
// even for root) runc fails to start the sandbox with EPERM otherwise.
func clampNoFile(n uint64) uint64 {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil || n <= lim.Max {
		return n
	}
	if hasCap(unix.CAP_SYS_RESOURCE) {
		return n
	}
	return lim.Max
}

// hasCap reports whether the calling thread has capability c effective.
func hasCap(c int) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[c/32].Effective&(1<<(uint(c)%32)) != 0
}

// New returns the backend called name ("runsc" or "runc").
func New(name string, cfg Config) (Runtime, error) {
	switch name {
	case "runsc", "":
		return NewRunsc(cfg)
	case "runc":
		return NewRunc(cfg)
	}
	return nil, fmt.Errorf("runtime: unknown backend %q (want runsc or runc)", name)
}
