package server

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/warren-sandbox/warren/internal/lockfile"
	"github.com/warren-sandbox/warren/internal/network"
	"github.com/warren-sandbox/warren/internal/setup"
	"golang.org/x/sys/unix"
)

// Two servers on one host. Everything a server makes on the host outside
// its data dir is named by four settings: the network prefix (namespaces,
// veths, nftables tables), the network range (addresses, routes), the run
// dir (runtime state) and the cgroup parent. A server removes at start what
// it finds under them and does not know, so two servers sharing any of
// them would take each other apart. Left unset, they are derived from the
// data dir: /var/lib/warren keeps the historic defaults, any other data
// dir gets its own (hostDefaults). Whatever they are, Run claims them
// before it touches anything: a lock per setting (and per data dir) in
// ClaimsDir, held for the server's life, and a check that no address or
// route of the host lies in the range but the server's own. A setting
// another live server holds stops the start with a message naming it.

// ClaimsDir holds the servers' lock files (root's, 0700).
var ClaimsDir = "/run/warren-claims"

// The historic defaults, which the default data dir keeps.
const (
	defaultRunDir       = "/run/warren"
	defaultCgroupParent = "/warren"
)

// hostDefaults fills the host settings cfg leaves empty: today's defaults
// for the default data dir, else ones of the data dir's own, from a hash
// of its absolute path: prefix "x" and 4 letters or digits (never a prefix
// of the default "wrn" or the tests' "w…" ones, and short enough for any
// veth name), a /16 in 10.12.0.0–10.111.0.0, /run/warren-<hash>,
// /warren-<hash>.
func hostDefaults(cfg *Config) error {
	abs, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return err
	}
	prefix, cidr, runDir, cgroup := network.DefaultPrefix, network.DefaultCIDR.String(), defaultRunDir, defaultCgroupParent
	if abs != setup.DefaultDataDir {
		h := dataDirHash(abs)
		prefix = "x" + h
		cidr = fmt.Sprintf("10.%d.0.0/16", 12+int(sha256.Sum256([]byte(abs))[8])%100)
		runDir = "/run/warren-" + h
		cgroup = "/warren-" + h
	}
	for _, f := range []struct {
		field *string
		value string
	}{{&cfg.NetworkPrefix, prefix}, {&cfg.NetworkCIDR, cidr}, {&cfg.RunDir, runDir}, {&cfg.CgroupParent, cgroup}} {
		if *f.field == "" {
			*f.field = f.value
		}
	}
	return nil
}

// dataDirHash is 4 letters and digits from the SHA-256 of a data dir's
// absolute path.
func dataDirHash(abs string) string {
	sum := sha256.Sum256([]byte(abs))
	s := new(big.Int).SetBytes(sum[:8]).Text(36)
	return fmt.Sprintf("%04s", s[len(s)-4:])
}

// claimHost claims cfg's data dir and host settings for this process (see
// above); release gives them back. cfg's settings must be filled in
// (hostDefaults).
func claimHost(cfg Config) (release func(), err error) {
	cidr, err := netip.ParsePrefix(cfg.NetworkCIDR)
	if err != nil {
		return nil, fmt.Errorf("--network-cidr: %w", err)
	}
	abs, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if err := claimsDir(); err != nil {
		return nil, err
	}
	owner := fmt.Sprintf("warren serve (pid %d, data dir %s)", os.Getpid(), abs)
	var releases []func()
	release = func() {
		for _, r := range releases {
			r()
		}
	}
	for _, c := range []struct{ kind, value, flag string }{
		{"data-dir", abs, "--data-dir"},
		{"network-prefix", cfg.NetworkPrefix, "--network-prefix"},
		{"network-cidr", cidr.Masked().String(), "--network-cidr"},
		{"run-dir", filepath.Clean(cfg.RunDir), "--run-dir"},
		{"cgroup-parent", filepath.Clean("/" + cfg.CgroupParent), "--cgroup-parent"},
	} {
		record := owner
		if c.kind == "network-prefix" {
			record += " prefix=" + c.value // what prefixesApart reads
		}
		r, holder, err := lockfile.TryAcquire(claimPath(c.kind, c.value), record)
		holder, _, _ = strings.Cut(holder, " prefix=")
		if errors.Is(err, lockfile.ErrHeld) {
			release()
			return nil, fmt.Errorf("%s %s is in use by another %s: stop it, or give this server another %s", c.flag, c.value, holderName(holder), c.flag)
		}
		if err != nil {
			release()
			return nil, fmt.Errorf("claiming %s %s: %w", c.flag, c.value, err)
		}
		releases = append(releases, r)
		// A stopped server's sandboxes run on: its names are still
		// its own until it starts again and adopts them (unless its
		// data dir is gone: then nobody can, and they are leftovers).
		if last := recordDataDir(holder); last != "" && last != abs && exists(last) && stillInUse(c.kind, c.value) {
			release()
			return nil, fmt.Errorf("%s %s was last used by the server of data dir %s, whose sandboxes are still on this host: start that server (warren serve --data-dir %s) and kill them, or give this server another %s",
				c.flag, c.value, last, last, c.flag)
		}
	}
	if err := prefixesApart(cfg.NetworkPrefix); err != nil {
		release()
		return nil, err
	}
	if err := network.CheckRangeFree(cidr, cfg.NetworkPrefix); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// recordDataDir is the data dir a claim's record names.
func recordDataDir(record string) string {
	_, dir, ok := strings.Cut(record, "data dir ")
	if !ok {
		return ""
	}
	dir, _, _ = strings.Cut(dir, ")")
	return dir
}

// stillInUse reports whether something of the named setting exists on
// the host: network namespaces with the prefix, cgroups under the parent.
// (The range is checked for addresses and routes by CheckRangeFree.)
func stillInUse(kind, value string) bool {
	switch kind {
	case "network-prefix":
		entries, _ := os.ReadDir("/run/netns")
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), value+"-") {
				return true
			}
		}
	case "cgroup-parent":
		entries, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup", value))
		for _, e := range entries {
			if e.IsDir() {
				return true
			}
		}
	}
	return false
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func holderName(h string) string {
	if h == "" {
		return "warren serve"
	}
	return h
}

// claimPath is the lock file of one setting: its kind and a hash of its
// value (values are paths and may hold anything).
func claimPath(kind, value string) string {
	sum := sha256.Sum256([]byte(value))
	return filepath.Join(ClaimsDir, fmt.Sprintf("%s-%x.lock", kind, sum[:8]))
}

// claimsDir makes ClaimsDir, root's and 0700, and refuses one that is
// not (a link, another owner): lock files there decide what a server may
// remove.
func claimsDir() error {
	if err := os.Mkdir(ClaimsDir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("claims: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(ClaimsDir, &st); err != nil {
		return fmt.Errorf("claims: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Geteuid() || st.Mode&0o077 != 0 {
		return fmt.Errorf("claims: %s must be a directory of uid %d with mode 0700 (found mode %o, uid %d): remove it", ClaimsDir, os.Geteuid(), st.Mode&0o7777, st.Uid)
	}
	return nil
}

// prefixesApart refuses a network prefix that another live server's
// would match or be matched by: nftables rules match veths by their
// prefix followed by "v", so "wrn" would also take "wrnv1"'s veths.
func prefixesApart(prefix string) error {
	entries, err := os.ReadDir(ClaimsDir)
	if err != nil {
		return fmt.Errorf("claims: %w", err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "network-prefix-") {
			continue
		}
		path := filepath.Join(ClaimsDir, e.Name())
		if path == claimPath("network-prefix", prefix) {
			continue
		}
		other, holder, live := liveClaim(path)
		if !live {
			continue
		}
		if strings.HasPrefix(other, prefix+"v") || strings.HasPrefix(prefix, other+"v") {
			return fmt.Errorf("--network-prefix %s and the prefix %s of a running %s would match each other's interfaces: choose a prefix that neither starts with the other followed by \"v\"",
				prefix, other, holderName(holder))
		}
	}
	return nil
}

// liveClaim reports the network prefix a lock file was taken for, by
// whom, and whether a live server holds it; the prefix is in the holder's
// record ("… prefix=P").
func liveClaim(path string) (prefix, holder string, live bool) {
	release, holder, err := lockfile.TryAcquire(path, "")
	if err == nil {
		release() // nobody's: a stale file
		return "", "", false
	}
	holder, prefix, _ = strings.Cut(holder, " prefix=")
	return prefix, holder, errors.Is(err, lockfile.ErrHeld) && prefix != ""
}
