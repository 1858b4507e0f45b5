package node

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"

	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/network"
	"github.com/warren-sandbox/warren/internal/rootpath"
)

// Egress is a sandbox's egress policy as the node enforces it: address
// rules on its network slot, and, when the policy names domains, rules or
// an upstream proxy, its TCP through the egress proxy.
type Egress struct {
	SandboxID, TeamID string
	Policy            egress.Policy
}

// SetEgress puts e in force for a running (or paused) sandbox, replacing
// its policy, without restarting it: the slot's rules change in one
// transaction and the connections the new policy forbids are cut.
func (n *Node) SetEgress(inst *Instance, e Egress) error {
	if inst.Slot == nil {
		return errors.New("node: the sandbox has no network slot")
	}
	pol := e.Policy
	sp := network.SlotPolicy{Allow: pol.Allow, Deny: pol.Deny, Proxy: pol.NeedsProxy()}
	proxy := n.cfg.EgressProxy
	if sp.Proxy && proxy == nil {
		return errors.New("node: this node runs no egress proxy, so it cannot enforce domain rules, transforms or an egressProxy")
	}
	// The proxy learns the policy first, so that the first redirected
	// connection finds it; it cuts its own connections the policy forbids.
	// A sandbox stays registered while it lives: connections it opened
	// through the proxy under an earlier policy are judged by the new one.
	if proxy != nil {
		proxy.Register(inst.Slot.SandboxIP, egress.Sandbox{ID: e.SandboxID, TeamID: e.TeamID, Policy: pol})
	}
	if err := n.cfg.Network.SetPolicy(inst.Slot, sp); err != nil {
		return fmt.Errorf("node: egress policy of %s: %w", inst.ID, err)
	}
	if err := n.cfg.Network.CutFlows(inst.Slot, func(dst netip.Addr) bool {
		return pol.CheckAddress(dst) == egress.AddrDenied
	}); err != nil {
		return err
	}
	inst.egress = &e
	return nil
}

// Egress returns the policy in force for the sandbox, nil for none.
func (inst *Instance) Egress() *Egress { return inst.egress }

// Where the node's CA lands in a sandbox: added to the system bundle
// (what OpenSSL, curl, Python's ssl and Go read, and what SSL_CERT_FILE
// and REQUESTS_CA_BUNDLE name), and alone in TrustCAPath (for
// NODE_EXTRA_CA_CERTS, which Node.js adds to its own roots).
const (
	SystemBundlePath = "/etc/ssl/certs/ca-certificates.crt"
	TrustCAPath      = "/etc/ssl/certs/warren-egress-ca.pem"
	maxBundle        = 8 << 20
)

// TrustEnv is the environment that points TLS clients at the trust
// store with the node's CA; the sandbox manager sets it on every sandbox
// when the node has one.
func (n *Node) TrustEnv() map[string]string {
	if len(n.cfg.TrustCA) == 0 {
		return nil
	}
	return map[string]string{
		"SSL_CERT_FILE":       SystemBundlePath,
		"REQUESTS_CA_BUNDLE":  SystemBundlePath,
		"NODE_EXTRA_CA_CERTS": TrustCAPath,
	}
}

// installTrustCA adds the node's CA to the sandbox's trust store, inside
// its root (a link at those paths is replaced, never followed; the
// template's bundle is read only if it is a regular file).
func (n *Node) installTrustCA(root *rootpath.Root) error {
	ca := n.cfg.TrustCA
	if len(ca) == 0 {
		return nil
	}
	bundle, err := root.ReadFile(SystemBundlePath, maxBundle)
	if err != nil {
		bundle = nil // missing or not a plain file: the bundle is the CA alone
	}
	if !bytes.Contains(bundle, bytes.TrimSpace(ca)) {
		if len(bundle) > 0 && !bytes.HasSuffix(bundle, []byte("\n")) {
			bundle = append(bundle, '\n')
		}
		bundle = append(bundle, ca...)
	}
	if err := root.WriteFile(SystemBundlePath, bundle, 0o644); err != nil {
		return fmt.Errorf("installing the egress CA: %w", err)
	}
	if err := root.WriteFile(TrustCAPath, ca, 0o644); err != nil {
		return fmt.Errorf("installing the egress CA: %w", err)
	}
	return nil
}

// HasEgressProxy reports whether the node can enforce domain rules,
// transforms and upstream proxies.
func (n *Node) HasEgressProxy() bool { return n.cfg.EgressProxy != nil }
