package api

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/api/gen"
	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/secret"
	"github.com/warren-sandbox/warren/internal/store"
)

// Secrets is what the API needs of the team secrets (*secret.Service).
type Secrets interface {
	Create(ctx context.Context, teamID, name, value string, metadata map[string]string) (store.Secret, error)
	Update(ctx context.Context, teamID, ref, value string, metadata map[string]string) (store.Secret, error)
	Get(ctx context.Context, teamID, ref string) (store.Secret, error)
	List(ctx context.Context, teamID string, after *store.SecretCursor, limit int) ([]store.Secret, error)
	Delete(ctx context.Context, teamID, ref string) error
}

var _ Secrets = (*secret.Service)(nil)

// networkOf turns the API's network object into the manager's.
func networkOf(n *gen.SandboxNetworkConfig) *sandbox.Network {
	if n == nil {
		return nil
	}
	return &sandbox.Network{
		AllowPublicTraffic: n.AllowPublicTraffic, AllowOut: deref(n.AllowOut), DenyOut: deref(n.DenyOut),
		MaskRequestHost: deref(n.MaskRequestHost), Rules: rulesOf(n.Rules), EgressProxy: egressProxyOf(n.EgressProxy),
	}
}

func rulesOf(r *gen.SandboxNetworkRules) map[string][]egress.Rule {
	if r == nil {
		return nil
	}
	out := map[string][]egress.Rule{}
	for host, rules := range *r {
		for _, rule := range rules {
			var er egress.Rule
			if rule.Transform != nil {
				er.Transform = &egress.Transform{Headers: map[string]string(deref(rule.Transform.Headers))}
			}
			out[host] = append(out[host], er)
		}
		if out[host] == nil {
			out[host] = []egress.Rule{}
		}
	}
	return out
}

func egressProxyOf(p *gen.SandboxEgressProxyConfig) *sandbox.EgressProxy {
	if p == nil {
		return nil
	}
	return &sandbox.EgressProxy{Address: p.Address, Username: deref(p.Username), Password: deref(p.Password)}
}

// networkConfigOf is a record's network object as getInfo shows it
// (sandbox.EffectiveNetwork: never the egressProxy's password).
func networkConfigOf(rec store.Sandbox) *gen.SandboxNetworkConfig {
	n := sandbox.EffectiveNetwork(rec)
	if n == nil {
		return nil
	}
	out := &gen.SandboxNetworkConfig{
		AllowPublicTraffic: n.AllowPublicTraffic, AllowOut: &n.AllowOut, DenyOut: &n.DenyOut, MaskRequestHost: nonEmpty(n.MaskRequestHost),
	}
	if out.AllowOut == nil || *out.AllowOut == nil {
		out.AllowOut = &[]string{}
	}
	if *out.DenyOut == nil {
		out.DenyOut = &[]string{}
	}
	if len(n.Rules) > 0 {
		rules := gen.SandboxNetworkRules{}
		for host, rs := range n.Rules {
			list := []gen.SandboxNetworkRule{}
			for _, r := range rs {
				var gr gen.SandboxNetworkRule
				if r.Transform != nil {
					h := gen.StringMap(r.Transform.Headers)
					gr.Transform = &gen.SandboxNetworkTransform{Headers: &h}
				}
				list = append(list, gr)
			}
			rules[host] = list
		}
		out.Rules = &rules
	}
	if p := n.EgressProxy; p != nil {
		out.EgressProxy = &gen.SandboxEgressProxyConfig{Address: p.Address, Username: nonEmpty(p.Username)}
	}
	return out
}

func (s *Server) UpdateSandboxNetwork(w http.ResponseWriter, r *http.Request, id gen.SandboxID) {
	var body gen.SandboxNetworkUpdateConfig
	if !readJSON(w, r, &body, false) {
		return
	}
	err := s.cfg.Sandboxes.UpdateNetwork(r.Context(), teamIDOf(r), id, sandbox.NetworkUpdate{
		AllowOut: deref(body.AllowOut), DenyOut: deref(body.DenyOut), Rules: rulesOf(body.Rules),
		EgressProxy: egressProxyOf(body.EgressProxy), AllowInternetAccess: body.AllowInternetAccess,
	})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// Secrets.

func secretOf(sec store.Secret) gen.Secret {
	meta := gen.StringMap(sec.Metadata)
	if meta == nil {
		meta = gen.StringMap{}
	}
	return gen.Secret{SecretID: sec.ID, Name: sec.Name, CurrentVersion: sec.CurrentVersion, Metadata: meta,
		CreatedAt: sec.CreatedAt.UTC(), UpdatedAt: sec.UpdatedAt.UTC()}
}

// failSecret maps the secret service's errors. Messages never carry a
// value: the service's errors do not, and decoding errors are replaced.
func (s *Server) failSecret(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, secret.ErrInvalid):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, secret.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, secret.ErrConflict):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, secret.ErrLimit):
		writeError(w, http.StatusTooManyRequests, err.Error())
	default:
		s.internal(w, r, err)
	}
}

// readSecretJSON is readJSON whose errors never quote the body, which
// holds a secret value.
func readSecretJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	status, err := decode(r.Body, v, false)
	if err != nil {
		msg := "invalid JSON body"
		if status == http.StatusRequestEntityTooLarge {
			msg = err.Error()
		}
		writeError(w, status, msg)
		return false
	}
	return true
}

func (s *Server) secrets(w http.ResponseWriter) bool {
	if s.cfg.Secrets == nil {
		writeError(w, http.StatusNotImplemented, "this server keeps no secrets")
		return false
	}
	return true
}

func (s *Server) CreateSecret(w http.ResponseWriter, r *http.Request) {
	var body gen.NewSecret
	if !s.secrets(w) || !readSecretJSON(w, r, &body) {
		return
	}
	sec, err := s.cfg.Secrets.Create(r.Context(), teamOf(r), body.Name, body.Value, map[string]string(deref(body.Metadata)))
	if err != nil {
		s.failSecret(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, secretOf(sec))
}

func (s *Server) UpdateSecret(w http.ResponseWriter, r *http.Request, ref string) {
	var body gen.SecretUpdate
	if !s.secrets(w) || !readSecretJSON(w, r, &body) {
		return
	}
	var meta map[string]string
	if body.Metadata != nil {
		meta = map[string]string(*body.Metadata)
	}
	sec, err := s.cfg.Secrets.Update(r.Context(), teamOf(r), ref, body.Value, meta)
	if err != nil {
		s.failSecret(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, secretOf(sec))
}

func (s *Server) GetSecret(w http.ResponseWriter, r *http.Request, ref string) {
	if !s.secrets(w) {
		return
	}
	sec, err := s.cfg.Secrets.Get(r.Context(), teamOf(r), ref)
	if err != nil {
		s.failSecret(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, secretOf(sec))
}

func (s *Server) DeleteSecret(w http.ResponseWriter, r *http.Request, ref string) {
	if !s.secrets(w) {
		return
	}
	if err := s.cfg.Secrets.Delete(r.Context(), teamOf(r), ref); err != nil {
		s.failSecret(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) ListSecrets(w http.ResponseWriter, r *http.Request, params gen.ListSecretsParams) {
	if !s.secrets(w) {
		return
	}
	limit := 100
	if params.Limit != nil {
		if *params.Limit < 1 || *params.Limit > 100 {
			writeError(w, http.StatusBadRequest, "limit must be between 1 and 100")
			return
		}
		limit = int(*params.Limit)
	}
	var after *store.SecretCursor
	if params.NextToken != nil && *params.NextToken != "" {
		c, err := parseSecretToken(*params.NextToken)
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		after = &c
	}
	secs, err := s.cfg.Secrets.List(r.Context(), teamOf(r), after, limit+1)
	if err != nil {
		s.failSecret(w, r, err)
		return
	}
	if len(secs) > limit {
		secs = secs[:limit]
		last := secs[limit-1]
		w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString([]byte(last.CreatedAt.UTC().Format(time.RFC3339Nano)+"__"+last.ID)))
	}
	out := make([]gen.Secret, 0, len(secs))
	for _, sec := range secs {
		out = append(out, secretOf(sec))
	}
	writeJSON(w, http.StatusOK, out)
}

func parseSecretToken(tok string) (store.SecretCursor, error) {
	bad := fmt.Errorf("invalid nextToken %q", tok)
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(tok, "="))
	if err != nil {
		return store.SecretCursor{}, bad
	}
	at, id, ok := strings.Cut(string(raw), "__")
	t, err := time.Parse(time.RFC3339Nano, at)
	if !ok || err != nil || !strings.HasPrefix(id, "sec_") {
		return store.SecretCursor{}, bad
	}
	return store.SecretCursor{CreatedAt: t, ID: id}, nil
}

// Logs v2: envd's log and the egress audit, each entry's fields.source
// saying which.

var levelRank = map[string]int{"debug": 0, "info": 1, "warn": 2, "error": 3}

func (s *Server) GetSandboxLogsV2(w http.ResponseWriter, r *http.Request, id gen.SandboxID, p gen.GetSandboxLogsV2Params) {
	limit := 1000
	if p.Limit != nil {
		if *p.Limit < 0 || *p.Limit > 1000 {
			writeError(w, http.StatusBadRequest, "limit must be between 0 and 1000")
			return
		}
		limit = int(*p.Limit)
	}
	backward := p.Direction != nil && *p.Direction == "backward"
	if p.Direction != nil && *p.Direction != "forward" && *p.Direction != "backward" {
		writeError(w, http.StatusBadRequest, "direction must be forward or backward")
		return
	}
	minRank := 0
	if p.Level != nil && *p.Level != "" {
		rank, ok := levelRank[strings.ToLower(*p.Level)]
		if !ok {
			writeError(w, http.StatusBadRequest, "level must be debug, info, warn or error")
			return
		}
		minRank = rank
	}
	if p.Search != nil && len(*p.Search) > 256 {
		writeError(w, http.StatusBadRequest, "search is at most 256 characters")
		return
	}
	source := ""
	if p.Source != nil {
		source = string(*p.Source)
		if source != "envd" && source != "network" {
			writeError(w, http.StatusBadRequest, "source must be envd or network")
			return
		}
	}
	var cursor time.Time
	if p.Cursor != nil {
		cursor = time.UnixMilli(*p.Cursor)
	}
	start := cursor
	if backward {
		start = time.Time{}
	}
	var entries []gen.SandboxLogEntry
	if source != "network" {
		logs, err := s.cfg.Sandboxes.Logs(r.Context(), teamIDOf(r), id, start, 0)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		for _, e := range logs {
			fields := gen.StringMap{"source": "envd"}
			for k, v := range e.Fields {
				fields[k] = v
			}
			entries = append(entries, gen.SandboxLogEntry{Timestamp: e.Time.UTC(), Level: e.Level, Message: e.Message, Fields: fields})
		}
	}
	if source != "envd" {
		audit, err := s.cfg.Sandboxes.NetworkLogs(r.Context(), teamIDOf(r), id, start, 0)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		for _, e := range audit {
			entries = append(entries, networkEntry(e))
		}
	}
	out := make([]gen.SandboxLogEntry, 0, min(limit, len(entries)))
	slices.SortStableFunc(entries, func(a, b gen.SandboxLogEntry) int { return a.Timestamp.Compare(b.Timestamp) })
	if backward {
		slices.Reverse(entries)
	}
	for _, e := range entries {
		if len(out) >= limit {
			break
		}
		if backward && !cursor.IsZero() && e.Timestamp.After(cursor) {
			continue
		}
		if levelRank[e.Level] < minRank || (p.Search != nil && !strings.Contains(e.Message, *p.Search)) {
			continue
		}
		out = append(out, e)
	}
	writeJSON(w, http.StatusOK, gen.SandboxLogsV2Response{Logs: out})
}

// networkEntry is an egress decision as a log entry: info when allowed,
// warn when denied.
func networkEntry(e egress.Entry) gen.SandboxLogEntry {
	level := "info"
	if e.Decision == egress.Deny {
		level = "warn"
	}
	what := e.Proto + " " + e.Dst
	if e.Host != "" {
		what = e.Proto + " " + e.Host + " (" + e.Dst + ")"
	}
	if e.Request != "" {
		what = e.Request + " " + what
	}
	msg := fmt.Sprintf("egress %s %s: %s", e.Decision, what, e.Rule)
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	fields := gen.StringMap{"source": "network", "decision": e.Decision, "proto": e.Proto, "dst": e.Dst, "rule": e.Rule}
	for k, v := range map[string]string{"host": e.Host, "via": e.Via, "request": e.Request, "reason": e.Reason, "injected": strings.Join(e.Injected, ",")} {
		if v != "" {
			fields[k] = v
		}
	}
	return gen.SandboxLogEntry{Timestamp: e.Time.UTC(), Level: level, Message: msg, Fields: fields}
}
