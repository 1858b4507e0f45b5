// Package resolvconf reads the node's resolver configuration (resolv.conf,
// as glibc reads it) and writes the one sandboxes get.
//
// A sandbox cannot use every resolver the node can: its loopback is its
// own, so the node's local resolvers (systemd-resolved's stub 127.0.0.53,
// a dnsmasq on 127.0.0.1) answer nothing there, and sandboxes have no IPv6.
// Load keeps the resolvers a sandbox can reach (and that the network's
// egress policy then opens port 53 of), replaces systemd-resolved's stub
// with the servers resolved forwards to, and says what it dropped.
package resolvconf

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

const (
	// SystemdStub is the address of systemd-resolved's local stub.
	SystemdStub = "127.0.0.53"
	// SystemdUpstream is where systemd-resolved lists the servers it
	// forwards to, in resolv.conf syntax.
	SystemdUpstream = "/run/systemd/resolve/resolv.conf"
	// MaxNameservers is how many nameservers glibc uses (MAXNS); it
	// ignores further ones.
	MaxNameservers = 3
)

// Config is what a resolv.conf says.
type Config struct {
	Nameservers []netip.Addr
	// Search is the search list; glibc uses the last "search" or
	// "domain" line.
	Search []string
	// Options are the words of every "options" line, in order.
	Options []string
	// Source is the file the configuration was read from, if any.
	Source string
}

// Parse reads resolv.conf syntax. Comments and keywords other than
// nameserver, search, domain and options are skipped; warnings name the
// nameserver lines that are not an IP address.
func Parse(r io.Reader) (Config, []string, error) {
	var c Config
	var warnings []string
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || strings.HasPrefix(f[0], "#") || strings.HasPrefix(f[0], ";") {
			continue
		}
		switch f[0] {
		case "nameserver":
			if len(f) < 2 {
				warnings = append(warnings, fmt.Sprintf("line %d: nameserver without an address", line))
				continue
			}
			a, err := netip.ParseAddr(f[1])
			if err != nil {
				warnings = append(warnings, fmt.Sprintf("line %d: nameserver %q is not an IP address", line, f[1]))
				continue
			}
			c.Nameservers = append(c.Nameservers, a)
		case "search", "domain":
			c.Search = words(f[1:])
		case "options":
			c.Options = append(c.Options, words(f[1:])...)
		}
	}
	return c, warnings, sc.Err()
}

// words cuts a line's words at the first comment.
func words(f []string) []string {
	for i, w := range f {
		if strings.HasPrefix(w, "#") || strings.HasPrefix(w, ";") {
			return f[:i]
		}
	}
	return f
}

// Load reads the resolver configuration at path for sandboxes. If it names
// only systemd-resolved's stub, SystemdUpstream is read instead. Resolvers
// a sandbox cannot reach (loopback, unspecified, IPv6) are dropped, and so
// are those beyond MaxNameservers; each drop is a warning, and so is an
// empty result: sandboxes then resolve no names.
func Load(path string) (Config, []string, error) {
	return load(path, SystemdUpstream)
}

func load(path, upstream string) (Config, []string, error) {
	c, warnings, err := parseFile(path)
	if err != nil {
		return Config{}, nil, err
	}
	if isStubOnly(c.Nameservers) {
		up, upWarnings, err := parseFile(upstream)
		if err != nil {
			warnings = append(warnings, fmt.Sprintf("%s names only systemd-resolved's stub %s, and its upstream servers are unknown: %v", path, SystemdStub, err))
		} else {
			c, warnings = up, append(warnings, upWarnings...)
		}
	}
	var kept []netip.Addr
	for _, a := range c.Nameservers {
		switch {
		case a.IsLoopback() || a.IsUnspecified() || a.Is4In6() && a.Unmap().IsLoopback():
			warnings = append(warnings, fmt.Sprintf("%s: dropped nameserver %s: it is on the node's loopback, which a sandbox cannot reach", c.Source, a))
		case !a.Is4() || a.IsMulticast():
			warnings = append(warnings, fmt.Sprintf("%s: dropped nameserver %s: sandboxes reach IPv4 unicast addresses only", c.Source, a))
		case slices.Contains(kept, a):
		case len(kept) == MaxNameservers:
			warnings = append(warnings, fmt.Sprintf("%s: dropped nameserver %s: only the first %d are used", c.Source, a, MaxNameservers))
		default:
			kept = append(kept, a)
		}
	}
	c.Nameservers = kept
	if len(kept) == 0 {
		warnings = append(warnings, fmt.Sprintf("%s: no nameserver a sandbox can reach: sandboxes will not resolve names", c.Source))
	}
	return c, warnings, nil
}

func parseFile(path string) (Config, []string, error) {
	f, err := os.Open(path)
	if err != nil {
		return Config{}, nil, err
	}
	defer f.Close()
	c, warnings, err := Parse(f)
	if err != nil {
		return Config{}, nil, fmt.Errorf("reading %s: %w", path, err)
	}
	c.Source = path
	for i, w := range warnings {
		warnings[i] = path + ": " + w
	}
	return c, warnings, nil
}

// isStubOnly reports whether the only nameserver is systemd-resolved's stub.
func isStubOnly(ns []netip.Addr) bool {
	stub := netip.MustParseAddr(SystemdStub)
	return len(ns) > 0 && !slices.ContainsFunc(ns, func(a netip.Addr) bool { return a != stub })
}

// Bytes renders the configuration as a resolv.conf.
func (c Config) Bytes() []byte {
	var b bytes.Buffer
	from := ""
	if c.Source != "" {
		from = " from " + c.Source
	}
	fmt.Fprintf(&b, "# Written by Warren%s: the resolvers sandboxes may reach.\n", from)
	for _, a := range c.Nameservers {
		fmt.Fprintf(&b, "nameserver %s\n", a)
	}
	if len(c.Search) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(c.Search, " "))
	}
	if len(c.Options) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(c.Options, " "))
	}
	return b.Bytes()
}

// WriteFile writes the configuration to path (mode 0644: every user in a
// sandbox reads it), creating its directory (0700) if needed. The file is
// replaced in one rename: sandboxes that bind-mounted the previous one
// keep reading it whole.
func (c Config) WriteFile(path string) (err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".resolv.conf-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(f.Name())
		}
	}()
	_, err = f.Write(c.Bytes())
	err = errors.Join(err, f.Chmod(0o644), f.Close())
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return os.Rename(f.Name(), path)
}
