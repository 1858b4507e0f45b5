package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/identity"
	"github.com/warren-sandbox/warren/internal/node"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
)

// A sandbox's egress policy lives in its record: the network object's
// allowOut, denyOut, rules and egressProxy in Extra (the proxy's password
// sealed, never in clear), and allow_internet_access in its column.
// egressOf compiles it for the node; nodeRequest carries it into every
// node.CreateRequest made from a record (a resume, a fork, a restore),
// and UpdateNetwork replaces it on a live sandbox.

// Sealer keeps values the API takes and never returns (secret.Sealer).
type Sealer interface {
	Seal(value, context string) (string, error)
	Open(sealed, context string) (string, error)
}

// EgressProxy is a sandbox's upstream proxy (SOCKS5 at host:port, HTTP
// CONNECT at http://host:port: egress.UpstreamProxy) as its record keeps
// it: the password the API was given is sealed into PasswordSealed.
type EgressProxy struct {
	Address        string `json:"address"`
	Username       string `json:"username,omitempty"`
	Password       string `json:"-"`
	PasswordSealed string `json:"passwordSealed,omitempty"`
}

// NetworkUpdate is the body of PUT /sandboxes/{id}/network: the whole
// egress configuration, replacing the sandbox's (omitted fields clear).
type NetworkUpdate struct {
	AllowOut, DenyOut   []string
	Rules               map[string][]egress.Rule
	EgressProxy         *EgressProxy
	AllowInternetAccess *bool
}

func passwordContext(teamID string) string { return "egress-proxy-password/" + teamID }

// egressConfig is the egress part of a network object, password in
// clear (opened with sealer when only sealed).
func egressConfig(n *Network, iam *IAM, teamID string, sealer Sealer) (egress.Config, error) {
	if n == nil {
		return egress.Config{Identity: iam.audiences()}, nil
	}
	cfg := egress.Config{AllowOut: n.AllowOut, DenyOut: n.DenyOut, Rules: n.Rules, Identity: iam.audiences()}
	if p := n.EgressProxy; p != nil {
		up := egress.UpstreamProxy{Address: p.Address, Username: p.Username, Password: p.Password}
		if up.Password == "" && p.PasswordSealed != "" {
			if sealer == nil {
				return cfg, errors.New("sandbox: no sealer to open the egressProxy password with")
			}
			pw, err := sealer.Open(p.PasswordSealed, passwordContext(teamID))
			if err != nil {
				return cfg, fmt.Errorf("sandbox: the egressProxy password: %w", err)
			}
			up.Password = pw
		}
		cfg.EgressProxy = &up
	}
	return cfg, nil
}

func allowsInternet(b *bool) bool { return b == nil || *b }

// compileEgress checks a network object and allow_internet_access, with
// the sandbox's identity tokens (the only ones its rules may use).
func compileEgress(n *Network, iam *IAM, teamID string, allowInternet *bool, sealer Sealer) (egress.Policy, error) {
	if err := checkIAM(iam); err != nil {
		return egress.Policy{}, err
	}
	cfg, err := egressConfig(n, iam, teamID, sealer)
	if err != nil {
		return egress.Policy{}, err
	}
	p, err := egress.Compile(cfg, allowsInternet(allowInternet))
	if errors.Is(err, egress.ErrInvalid) {
		return p, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return p, err
}

// checkIAM checks a create's iam as E2B's API does: at most
// egress.MaxIdentityTokens tokens, each named (a name a placeholder can
// hold), with an audience and the type JWT-SVID.
func checkIAM(iam *IAM) error {
	if iam == nil {
		return nil
	}
	if len(iam.Tokens) > egress.MaxIdentityTokens {
		return fmt.Errorf("%w: iam.tokens: too many tokens: %d (max %d)", ErrInvalid, len(iam.Tokens), egress.MaxIdentityTokens)
	}
	for name, t := range iam.Tokens {
		if err := egress.CheckTokenName(name); err != nil {
			return fmt.Errorf("%w: iam.tokens: token name %q: %v", ErrInvalid, name, err)
		}
		if t.Audience == "" {
			return fmt.Errorf("%w: iam.tokens.%s.audience: audience is required", ErrInvalid, name)
		}
		if t.TokenType != identity.TokenType {
			return fmt.Errorf("%w: iam.tokens.%s.tokenType: only %q is supported", ErrInvalid, name, identity.TokenType)
		}
	}
	return nil
}

// sealPassword moves an egressProxy password the API gave into its
// sealed field.
func (m *Manager) sealPassword(n *Network, teamID string) error {
	if n == nil || n.EgressProxy == nil || n.EgressProxy.Password == "" {
		return nil
	}
	if m.cfg.Sealer == nil {
		return fmt.Errorf("%w: this node cannot keep an egressProxy password", ErrInvalid)
	}
	sealed, err := m.cfg.Sealer.Seal(n.EgressProxy.Password, passwordContext(teamID))
	if err != nil {
		return err
	}
	n.EgressProxy.PasswordSealed, n.EgressProxy.Password = sealed, ""
	return nil
}

// checkUpstream refuses an egressProxy the node would never dial.
func (m *Manager) checkUpstream(ctx context.Context, p egress.Policy) error {
	if p.Upstream == nil || m.cfg.CheckEgressProxy == nil {
		return nil
	}
	_, hostPort := p.Upstream.Endpoint()
	if err := m.cfg.CheckEgressProxy(ctx, hostPort); err != nil {
		return fmt.Errorf("%w: egressProxy %s: %v", ErrInvalid, p.Upstream.Address, err)
	}
	return nil
}

// egressOf is the policy a sandbox's record asks for, nil when it asks
// for none.
func (m *Manager) egressOf(rec store.Sandbox) (*node.Egress, error) {
	ex := ParseExtra(rec.Extra)
	p, err := compileEgress(ex.Network, ex.IAM, rec.TeamID, rec.AllowInternetAccess, m.cfg.Sealer)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: its recorded egress policy: %w", rec.ID, err)
	}
	if p.Empty() {
		return nil, nil
	}
	return &node.Egress{SandboxID: rec.ID, TeamID: rec.TeamID, Policy: p}, nil
}

// applyEgress puts a record's policy in force on a running instance
// (a claimed warm sandbox, an adopted one).
func (m *Manager) applyEgress(rec store.Sandbox, inst *node.Instance) error {
	eg, err := m.egressOf(rec)
	if err != nil {
		return err
	}
	if eg == nil {
		if inst.Egress() == nil {
			return nil
		}
		eg = &node.Egress{SandboxID: rec.ID, TeamID: rec.TeamID}
	}
	return m.cfg.Node.SetEgress(inst, *eg)
}

// UpdateNetwork replaces a sandbox's egress configuration while it runs
// (or is paused), without a restart: the record first, then the node;
// connections the new policy forbids are cut.
func (m *Manager) UpdateNetwork(ctx context.Context, teamID team.ID, id string, u NetworkUpdate) error {
	l, err := m.lookup(teamID.Scope(), id)
	if err != nil {
		return err
	}
	next := func(rec store.Sandbox) store.Sandbox {
		ex := ParseExtra(rec.Extra)
		n := ex.Network
		if n == nil {
			n = &Network{}
		}
		n.AllowOut, n.DenyOut, n.Rules, n.EgressProxy = u.AllowOut, u.DenyOut, u.Rules, u.EgressProxy
		ex.Network = n
		rec.Extra, rec.AllowInternetAccess = ex.String(), u.AllowInternetAccess
		return rec
	}
	n := &Network{AllowOut: u.AllowOut, DenyOut: u.DenyOut, Rules: u.Rules, EgressProxy: u.EgressProxy}
	// The identity tokens were fixed at create: new rules may use them.
	cur, err := m.cfg.Store.GetSandbox(ctx, id)
	if err != nil || !teamID.Owns(cur.TeamID) {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	pol, err := compileEgress(n, ParseExtra(cur.Extra).IAM, teamID.String(), u.AllowInternetAccess, m.cfg.Sealer)
	if err != nil {
		return err
	}
	if err := m.checkUpstream(ctx, pol); err != nil {
		return err
	}
	if err := m.sealPassword(n, teamID.String()); err != nil {
		return err
	}
	u.EgressProxy = n.EgressProxy
	if pol.NeedsProxy() && !m.cfg.Node.HasEgressProxy() {
		return fmt.Errorf("%w: this node runs no egress proxy: domains, rules and egressProxy cannot be enforced", ErrInvalid)
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := m.pausedNow(l); err != nil {
		return err
	}
	var before store.Sandbox
	rec, err := m.cfg.Store.UpdateSandbox(ctx, id, func(s *store.Sandbox) error {
		if !visible(s.State) {
			return fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		before = *s
		*s = next(*s)
		return nil
	})
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return err
	}
	if l.inst == nil {
		return nil // not on the node now: applied when it is (resume)
	}
	if err := m.applyEgress(rec, l.inst); err != nil {
		// Put the record back: it must say what is in force.
		if _, rerr := m.cfg.Store.UpdateSandbox(context.WithoutCancel(ctx), id, func(s *store.Sandbox) error {
			s.Extra, s.AllowInternetAccess = before.Extra, before.AllowInternetAccess
			return nil
		}); rerr != nil {
			m.log.ErrorContext(ctx, "restoring a sandbox's network record after a failed update", "sandbox", id, "err", rerr)
		}
		return fmt.Errorf("%w: the new policy could not be applied: %v", ErrConflict, err)
	}
	m.log.InfoContext(ctx, "sandbox network updated", "sandbox", id, "allow", len(pol.Allow), "deny", len(pol.Deny),
		"domains", len(pol.Domains), "rules", len(pol.Rules), "proxied", pol.NeedsProxy())
	return nil
}

// EffectiveNetwork is the network object GET /sandboxes/{id} shows:
// what the record says, with allow_internet_access=false shown as the
// deny of all traffic it is, and never the egressProxy's password.
func EffectiveNetwork(rec store.Sandbox) *Network {
	n := ParseExtra(rec.Extra).Network
	if n == nil && allowsInternet(rec.AllowInternetAccess) {
		return nil
	}
	out := &Network{}
	if n != nil {
		c := *n
		out = &c
	}
	if !allowsInternet(rec.AllowInternetAccess) && !slices.Contains(out.DenyOut, egress.AllTraffic) {
		out.DenyOut = append(slices.Clone(out.DenyOut), egress.AllTraffic)
	}
	if out.EgressProxy != nil {
		out.EgressProxy = &EgressProxy{Address: out.EgressProxy.Address, Username: out.EgressProxy.Username}
	}
	return out
}

// NetworkLogs returns up to limit egress audit entries of a team's live
// sandbox at or after start, oldest first.
func (m *Manager) NetworkLogs(ctx context.Context, teamID team.ID, id string, start time.Time, limit int) ([]egress.Entry, error) {
	if _, err := m.lookup(teamID.Scope(), id); err != nil {
		return nil, err
	}
	if m.cfg.Audit == nil {
		return []egress.Entry{}, nil
	}
	return m.cfg.Audit.Read(id, start, limit)
}
