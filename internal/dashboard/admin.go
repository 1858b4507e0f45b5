package dashboard

import (
	"context"
	"crypto/subtle"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/cluster"
	"github.com/warren-sandbox/warren/internal/store"
)

// The admin door: /dashboard/admin/ serves the nodes page's calls (list,
// cordon, uncordon, drain) to a session signed in with the server's
// admin token, and only on a Handler made with Config.Admin, which
// `warren serve` does only on --admin-addr, a listener of its own: the
// API's address, whose clients are tenants, has no admin surface at all.
//
// An admin session reaches only /dashboard/admin/ (never the API or a
// sandbox: the admin token is no team's credential), and a team's session
// never reaches /dashboard/admin/.

// Nodes is what the nodes page needs of the store.
type Nodes interface {
	ListNodes(ctx context.Context) ([]store.Node, error)
	SetNodeState(ctx context.Context, name string, state store.NodeState) error
}

// AdminConfig enables the admin door.
type AdminConfig struct {
	// Token is the admin credential (DATA-DIR/admin-token); empty: the
	// door is shut.
	Token string
	Nodes Nodes
	// LostAfter is how long a node goes unheard before it is lost.
	LostAfter time.Duration
}

// adminTeam is an admin session's team (no tenant's: team IDs are UUIDs).
const adminTeam = "admin:"

func (h *Handler) isAdminToken(secret string) bool {
	a := h.cfg.Admin
	return a != nil && a.Token != "" && subtle.ConstantTimeCompare([]byte(secret), []byte(a.Token)) == 1
}

// nodeJSON is a node as the nodes page shows it.
type nodeJSON struct {
	Name         string            `json:"name"`
	State        string            `json:"state"`
	Address      string            `json:"address"`
	Runtime      string            `json:"runtime"`
	Sandboxes    int               `json:"sandboxes"`
	MaxSandboxes int               `json:"maxSandboxes"`
	CPUs         int               `json:"cpus"`
	UsedCPUs     int               `json:"usedCpus"`
	MemoryMB     int               `json:"memoryMB"`
	UsedMemoryMB int               `json:"usedMemoryMB"`
	DiskMB       int               `json:"diskMB"`
	FreeDiskMB   int               `json:"freeDiskMB"`
	Labels       map[string]string `json:"labels"`
	HeartbeatAt  time.Time         `json:"heartbeatAt"`
}

var nodeActions = map[string]store.NodeState{"cordon": store.NodeCordoned, "uncordon": store.NodeReady, "drain": store.NodeDraining}

func (h *Handler) serveAdmin(w http.ResponseWriter, r *http.Request, rest string) {
	a := h.cfg.Admin
	if a == nil || a.Token == "" || a.Nodes == nil {
		writeError(w, http.StatusNotFound, "no admin surface on this address (see warren serve --admin-addr)")
		return
	}
	s := h.authorize(w, r)
	if s == nil {
		return
	}
	if !s.admin {
		writeError(w, http.StatusForbidden, "nodes are for the admin credential, not a team's")
		return
	}
	ctx := r.Context()
	switch {
	case rest == "/nodes" && r.Method == http.MethodGet:
		nodes, err := a.Nodes.ListNodes(ctx)
		if err != nil {
			writeError(w, http.StatusInternalServerError, "listing the nodes failed")
			return
		}
		now := h.cfg.Now()
		lost := a.LostAfter
		if lost <= 0 {
			lost = cluster.DefaultLostAfter
		}
		out := make([]nodeJSON, 0, len(nodes))
		for _, n := range nodes {
			out = append(out, nodeJSON{Name: n.Name, State: cluster.StateOf(n, now, lost), Address: n.Address, Runtime: n.Runtime,
				Sandboxes: n.Sandboxes, MaxSandboxes: n.MaxSandboxes, CPUs: n.CPUs, UsedCPUs: n.UsedCPUs, MemoryMB: n.MemoryMB,
				UsedMemoryMB: n.UsedMemoryMB, DiskMB: n.DiskMB, FreeDiskMB: n.FreeDiskMB, Labels: n.Labels, HeartbeatAt: n.HeartbeatAt.UTC()})
		}
		writeJSONBody(w, http.StatusOK, out)
	case strings.HasPrefix(rest, "/nodes/") && r.Method == http.MethodPost:
		name, action, _ := strings.Cut(strings.TrimPrefix(rest, "/nodes/"), "/")
		state, ok := nodeActions[action]
		if name == "" || !ok {
			writeError(w, http.StatusNotFound, "POST /dashboard/admin/nodes/{name}/cordon|uncordon|drain")
			return
		}
		if err := a.Nodes.SetNodeState(ctx, name, state); errors.Is(err, store.ErrNotFound) {
			writeError(w, http.StatusNotFound, "no node named "+name)
			return
		} else if err != nil {
			writeError(w, http.StatusInternalServerError, "setting the node's state failed")
			return
		}
		writeJSONBody(w, http.StatusOK, map[string]string{"name": name, "state": string(state)})
	default:
		writeError(w, http.StatusNotFound, "GET /dashboard/admin/nodes, POST /dashboard/admin/nodes/{name}/cordon|uncordon|drain")
	}
}
