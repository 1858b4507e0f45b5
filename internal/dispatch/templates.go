package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"net/http/httputil"
	"strings"

	"github.com/warren-sandbox/warren/internal/api"
	"github.com/warren-sandbox/warren/internal/cluster"
	"github.com/warren-sandbox/warren/internal/noderpc"
	"github.com/warren-sandbox/warren/internal/store"
)

// Templates are built on nodes: a template's layers, uploads and build
// sandboxes are in the data dir of the node that built it. An api sends
// the platform API's template routes to a node, which serves them with
// its own template builder (the request's API key checked there, against
// the shared store):
//
//   - a route about one template goes to the template's home: of the
//     nodes that are heard from, the one rendezvous hashing picks for
//     the template's ID (the same from any api, as long as the nodes
//     stay), so that its uploads, build and files meet on one node;
//   - a sandbox's snapshot goes to the sandbox's node (its checkpoint);
//   - the other routes (lists, tags, aliases, E2B's dashboard-api: the
//     store's records) to the home of "".
//
// Sandboxes of a template are placed first on the node that built it
// (Create), where its image is: its home, unless the nodes changed since;
// another node pulls the image, its layers and checkpoint, when it must
// start one (internal/imagepeer). A node that has not got a template
// refuses it, and the next is asked.

// templateKey says where a platform API request goes: ok is false for
// routes that are not the template service's; else sandbox is set for a
// sandbox's snapshot, key for the others.
func templateKey(path string) (key, sandbox string, ok bool) {
	seg := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(seg) >= 3 && seg[0] == "sandboxes" && seg[2] == "snapshots":
		return "", seg[1], true
	case seg[0] == "snapshots":
		return "", "", true
	case seg[0] == "templates":
		if len(seg) >= 2 && seg[1] != "tags" && seg[1] != "aliases" {
			return seg[1], "", true
		}
		return "", "", true
	case len(seg) >= 2 && (seg[0] == "v2" || seg[0] == "v3") && seg[1] == "templates":
		if len(seg) >= 3 {
			return seg[2], "", true
		}
		return "", "", true
	case len(seg) >= 3 && seg[0] == "upload" && seg[1] == "templates":
		return seg[2], "", true
	case seg[0] == strings.TrimPrefix(api.DashboardAPIPrefix, "/"):
		// E2B's dashboard-api: reads of the template service's records.
		return "", "", true
	}
	return "", "", false
}

// home is the node rendezvous hashing picks for key among the nodes that
// are heard from and have an address, ready ones first.
func (d *Dispatcher) home(ctx context.Context, key string) (store.Node, bool) {
	ns, err := d.nodeList(ctx)
	if err != nil {
		return store.Node{}, false
	}
	var best store.Node
	var bestScore uint64
	found, bestReady := false, false
	for _, n := range ns {
		if n.Address == "" || n.Lost(d.cfg.Now(), d.cfg.LostAfter) {
			continue
		}
		ready := n.State == store.NodeReady
		sum := sha256.Sum256([]byte(key + "\x00" + n.Name))
		score := binary.BigEndian.Uint64(sum[:8])
		if !found || ready && !bestReady || ready == bestReady && score > bestScore {
			best, bestScore, bestReady, found = n, score, ready, true
		}
	}
	return best, found
}

// Platform serves the platform API: the template routes on a node (see
// above), the rest by api.
func (d *Dispatcher) Platform(api http.Handler) http.Handler {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			n := pr.In.Context().Value(platformKey{}).(store.Node)
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = n.Address
			// The path stays (its escaped form too: a ref may hold an
			// escaped '/'): the node serves it as a platform request
			// because it is signed as one.
			pr.Out = pr.Out.WithContext(cluster.WithTarget(cluster.WithPurpose(pr.Out.Context(), cluster.PurposePlatform), n.Name))
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Set(noderpc.ClientAddrHeader, pr.In.RemoteAddr)
		},
		Transport:     d.cfg.Transport,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			d.log.WarnContext(r.Context(), "dispatch: forwarding a template request failed", "path", r.URL.Path, "err", err)
			writeError(w, http.StatusServiceUnavailable, "the node serving this template did not answer; retry shortly")
		},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, sbx, ok := templateKey(r.URL.Path)
		if !ok {
			api.ServeHTTP(w, r)
			return
		}
		var node store.Node
		if sbx != "" {
			if rec, err := d.cfg.Store.GetSandbox(r.Context(), sbx); err == nil {
				if n, err := d.liveNode(r.Context(), rec.Node, sbx); err == nil {
					node = n
				}
			}
		}
		if node.Address == "" {
			n, ok := d.home(r.Context(), key)
			if !ok {
				writeError(w, http.StatusServiceUnavailable, "no node is up to serve templates (`warren nodes` shows their states)")
				return
			}
			node = n
		}
		rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), platformKey{}, node)))
	})
}

type platformKey struct{}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": status, "message": msg})
}
