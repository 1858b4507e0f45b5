// Package noderpc is the internal RPC between a cluster's api and node
// processes (proto/node/v1): the node side serves NodeService on its
// sandbox manager, beside the sandbox traffic the api's proxy forwards,
// the platform routes and the image pulls, all behind the cluster's
// authentication and each to the requests signed for its purpose
// (docs/cluster-security.md); the api side is a Client per node that
// turns the node's errors back into the sandbox manager's (so the api
// answers them as a single server would).
package noderpc

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/api"
	"github.com/warren-sandbox/warren/internal/cluster"
	"github.com/warren-sandbox/warren/internal/sandbox"
	nodev1 "github.com/warren-sandbox/warren/proto/node/v1"
	"github.com/warren-sandbox/warren/proto/node/v1/nodev1connect"
)

// Sandboxes is what a node serves of its sandbox manager
// (*sandbox.Manager): what the platform API needs of one.
type Sandboxes = api.Sandboxes

var _ Sandboxes = (*sandbox.Manager)(nil)

// ClientAddrHeader carries, on forwarded sandbox traffic and platform
// requests, the address of the client the api took the request from:
// the node budgets wrong tokens per client, not per api process. Only a
// signed one (cluster.HeadersHeader lists it) on those purposes is
// believed.
const ClientAddrHeader = "Warren-Client-Addr"

// maxRPCBody bounds a NodeService call's body: it is read whole, and its
// proof checked, before the call is served.
const maxRPCBody = 8 << 20

// platformPrefetch is how much of a platform request's body is read, and
// so verified, before the platform API serves it: JSON bodies whole;
// longer ones (uploads) are verified at their end, where a mismatch fails
// their reader.
const platformPrefetch = 1 << 20

// Served is what a node serves on its internal address, each to the
// requests signed for its purpose (cluster.Purpose) whatever their path.
type Served struct {
	// Sandboxes serves NodeService (cluster.PurposeRPC).
	Sandboxes Sandboxes
	// Traffic is the node's own sandbox proxy: the sandbox traffic an
	// api's proxy forwards (cluster.PurposeTraffic), its path the
	// client's.
	Traffic http.Handler
	// Platform is the platform API, for the template routes an api
	// forwards (cluster.PurposePlatform, their own paths); nil: none.
	Platform http.Handler
	// Images serves built images to the other nodes
	// (internal/imagepeer, cluster.PurposeImages); nil: none.
	Images http.Handler
	// Teams says which teams exist: every NodeService call must name
	// one (teams.go). nil refuses every call.
	Teams Teams
}

// Handler is a node's internal address. It dispatches on the purpose a
// request was signed for (guard checks it), never on its path: sandbox
// traffic for /warren.node.v1.NodeService/… or /images/… is sandbox
// traffic. Nothing is served without the cluster's authentication but
// GET /health without it (the probes'), which says only that the node
// serves.
func Handler(s Served, guard *cluster.Guard) http.Handler {
	rpc := http.NewServeMux()
	rpc.Handle(nodeService(s))
	refuse := func(w http.ResponseWriter, code int, msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(map[string]any{"code": code, "message": msg})
	}
	byPurpose := func(w http.ResponseWriter, r *http.Request) {
		switch cluster.PurposeOf(r.Context()) {
		case cluster.PurposeRPC:
			r.Header.Del(ClientAddrHeader)
			if err := cluster.BufferBody(r, maxRPCBody); err != nil {
				refuse(w, bodyStatus(err), "the call's body: "+err.Error())
				return
			}
			rpc.ServeHTTP(w, r)
		case cluster.PurposeTraffic:
			fromClient(r)
			s.Traffic.ServeHTTP(w, r)
		case cluster.PurposePlatform:
			if s.Platform == nil {
				refuse(w, http.StatusNotFound, "this node serves no platform API")
				return
			}
			fromClient(r)
			if err := cluster.Prefetch(r, platformPrefetch); err != nil {
				refuse(w, bodyStatus(err), "the request's body: "+err.Error())
				return
			}
			s.Platform.ServeHTTP(w, r)
		case cluster.PurposeImages:
			r.Header.Del(ClientAddrHeader)
			if s.Images == nil {
				refuse(w, http.StatusNotFound, "this node serves no images")
				return
			}
			s.Images.ServeHTTP(w, r)
		default: // the guard lets no other through
			refuse(w, http.StatusUnauthorized, "no purpose")
		}
	}
	authed := guard.Serve(http.HandlerFunc(byPurpose))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" && r.Method == http.MethodGet && r.Header.Get(cluster.AuthHeader) == "" {
			w.Header().Set("Content-Type", "text/plain")
			_, _ = w.Write([]byte("ok\n"))
			return
		}
		authed.ServeHTTP(w, r)
	})
}

// fromClient makes r come from the client the api named (a signed
// ClientAddrHeader: the guard dropped unsigned ones).
func fromClient(r *http.Request) {
	if a := r.Header.Get(ClientAddrHeader); a != "" {
		r.RemoteAddr = a
	}
	r.Header.Del(ClientAddrHeader)
}

// bodyStatus is the status of a body that could not be read whole.
func bodyStatus(err error) int {
	if errors.Is(err, cluster.ErrBodyTooLarge) {
		return http.StatusRequestEntityTooLarge
	}
	return http.StatusBadRequest
}

// nodeService is NodeService's path and handler: the service on the
// sandbox manager, behind the check of each call's team.
func nodeService(s Served) (string, http.Handler) {
	return nodev1connect.NewNodeServiceHandler(newService(s.Sandboxes), connect.WithInterceptors(teamGuard(s.Teams)),
		connect.WithCompressMinBytes(compressMinBytes))
}

// compressMinBytes is the smallest answer a node gzips (when the api
// accepts it, as Connect's clients do by default). Most answers are a
// sandbox's record of a kilobyte or two, which crosses a cluster's own
// network as fast as it compresses: gzipping each took a sixth of the
// api and nodes' CPU in test/scale's creates.
const compressMinBytes = 32 << 10

// service serves NodeService on a sandbox manager.
type service struct {
	m Sandboxes
	// creates are the recent creates, for AbandonCreate (creates.go).
	creates *createLog
}

func newService(m Sandboxes) service { return service{m: m, creates: newCreateLog()} }

var _ nodev1connect.NodeServiceHandler = service{}

func ms(n int64) time.Duration               { return time.Duration(n) * time.Millisecond }
func unixMS(n int64) time.Time               { return time.UnixMilli(n) }
func reply[T any](m *T) *connect.Response[T] { return connect.NewResponse(m) }

func (s service) CreateSandbox(ctx context.Context, req *connect.Request[nodev1.CreateSandboxRequest]) (*connect.Response[nodev1.CreateSandboxResponse], error) {
	r := req.Msg
	tm, err := teamOf(r)
	if err != nil {
		return nil, err
	}
	cr := sandbox.CreateRequest{
		TeamID: tm, TemplateID: r.TemplateId, Timeout: ms(r.TimeoutMs),
		Metadata: r.Metadata, EnvVars: r.EnvVars, AutoPause: r.AutoPause, AutoPauseMemory: r.AutoPauseMemory,
		AutoResume: r.AutoResume, Secure: r.Secure, AllowInternetAccess: r.AllowInternetAccess,
	}
	for _, v := range r.VolumeMounts {
		cr.VolumeMounts = append(cr.VolumeMounts, sandbox.VolumeMount{Name: v.Name, Path: v.Path})
	}
	if r.ExtraJson != "" {
		if err := json.Unmarshal([]byte(r.ExtraJson), &cr.Extra); err != nil {
			return nil, connect.NewError(connect.CodeInvalidArgument, err)
		}
	}
	if r.EgressProxyPassword != "" {
		if cr.Extra.Network == nil || cr.Extra.Network.EgressProxy == nil {
			return nil, toConnect(sandboxInvalid("an egress proxy password without an egress proxy"))
		}
		cr.Extra.Network.EgressProxy.Password = r.EgressProxyPassword
	}
	return s.create(ctx, r.RequestId, cr)
}

func (s service) KillSandbox(ctx context.Context, req *connect.Request[nodev1.KillSandboxRequest]) (*connect.Response[nodev1.KillSandboxResponse], error) {
	tm, err := teamOf(req.Msg)
	if err != nil {
		return nil, err
	}
	return reply(&nodev1.KillSandboxResponse{}), toConnect(s.m.Kill(ctx, tm, req.Msg.SandboxId))
}

func (s service) SetTimeout(ctx context.Context, req *connect.Request[nodev1.SetTimeoutRequest]) (*connect.Response[nodev1.SetTimeoutResponse], error) {
	tm, err := teamOf(req.Msg)
	if err != nil {
		return nil, err
	}
	return reply(&nodev1.SetTimeoutResponse{}), toConnect(s.m.SetTimeout(ctx, tm, req.Msg.SandboxId, ms(req.Msg.TimeoutMs)))
}

func (s service) Refresh(ctx context.Context, req *connect.Request[nodev1.RefreshRequest]) (*connect.Response[nodev1.RefreshResponse], error) {
	tm, err := teamOf(req.Msg)
	if err != nil {
		return nil, err
	}
	return reply(&nodev1.RefreshResponse{}), toConnect(s.m.Refresh(ctx, tm, req.Msg.SandboxId, ms(req.Msg.DurationMs)))
}

func (s service) Connect(ctx context.Context, req *connect.Request[nodev1.ConnectRequest]) (*connect.Response[nodev1.ConnectResponse], error) {
	tm, err := teamOf(req.Msg)
	if err != nil {
		return nil, err
	}
	rec, resumed, err := s.m.Connect(ctx, tm, req.Msg.SandboxId, ms(req.Msg.TimeoutMs), req.Msg.Memory)
	if err != nil {
		return nil, toConnect(err)
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return nil, toConnect(err)
	}
	return reply(&nodev1.ConnectResponse{Resumed: resumed, SandboxJson: string(b)}), nil
}

func (s service) Pause(ctx context.Context, req *connect.Request[nodev1.PauseRequest]) (*connect.Response[nodev1.PauseResponse], error) {
	tm, err := teamOf(req.Msg)
	if err != nil {
		return nil, err
	}
	paused, err := s.m.Pause(ctx, tm, req.Msg.SandboxId, req.Msg.KeepMemory)
	if err != nil {
		return nil, toConnect(err)
	}
	return reply(&nodev1.PauseResponse{Paused: paused}), nil
}

func (s service) Resume(ctx context.Context, req *connect.Request[nodev1.ResumeRequest]) (*connect.Response[nodev1.ResumeResponse], error) {
	r := req.Msg
	tm, err := teamOf(r)
	if err != nil {
		return nil, err
	}
	rec, err := s.m.ResumeSandbox(ctx, tm, r.SandboxId, sandbox.ResumeOptions{Timeout: ms(r.TimeoutMs), AutoPause: r.AutoPause, Memory: r.Memory})
	if err != nil {
		return nil, toConnect(err)
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return nil, toConnect(err)
	}
	return reply(&nodev1.ResumeResponse{SandboxJson: string(b)}), nil
}

func (s service) Fork(ctx context.Context, req *connect.Request[nodev1.ForkRequest]) (*connect.Response[nodev1.ForkResponse], error) {
	r := req.Msg
	tm, err := teamOf(r)
	if err != nil {
		return nil, err
	}
	res, err := s.m.Fork(ctx, tm, r.SandboxId, ms(r.TimeoutMs), int(r.Count))
	if err != nil {
		return nil, toConnect(err)
	}
	out := &nodev1.ForkResponse{}
	for _, c := range res {
		child := &nodev1.ForkChild{SandboxId: c.Sandbox.ID}
		if c.Err != nil {
			child = &nodev1.ForkChild{ErrorKind: kindOf(c.Err), ErrorMessage: c.Err.Error()}
		}
		out.Children = append(out.Children, child)
	}
	return reply(out), nil
}

func (s service) Metrics(ctx context.Context, req *connect.Request[nodev1.MetricsRequest]) (*connect.Response[nodev1.MetricsResponse], error) {
	r := req.Msg
	tm, err := teamOf(r)
	if err != nil {
		return nil, err
	}
	ms, err := s.m.Metrics(ctx, tm, r.SandboxId, unixMS(r.StartUnixMs), unixMS(r.EndUnixMs))
	if err != nil {
		return nil, toConnect(err)
	}
	out := &nodev1.MetricsResponse{}
	for _, m := range ms {
		out.Metrics = append(out.Metrics, &nodev1.Metric{TimeUnixMs: m.Time.UnixMilli(), CpuCount: int32(m.CPUCount), CpuUsedPct: m.CPUUsedPct,
			MemUsed: m.MemUsed, MemTotal: m.MemTotal, MemCache: m.MemCache, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal})
	}
	return reply(out), nil
}

func (s service) Logs(ctx context.Context, req *connect.Request[nodev1.LogsRequest]) (*connect.Response[nodev1.LogsResponse], error) {
	r := req.Msg
	tm, err := teamOf(r)
	if err != nil {
		return nil, err
	}
	es, err := s.m.Logs(ctx, tm, r.SandboxId, unixMS(r.StartUnixMs), int(r.Limit))
	if err != nil {
		return nil, toConnect(err)
	}
	out := &nodev1.LogsResponse{}
	for _, e := range es {
		out.Entries = append(out.Entries, &nodev1.LogEntry{TimeUnixMs: e.Time.UnixMilli(), Level: e.Level, Message: e.Message, Fields: e.Fields, Line: e.Line})
	}
	return reply(out), nil
}

func (s service) UpdateNetwork(ctx context.Context, req *connect.Request[nodev1.UpdateNetworkRequest]) (*connect.Response[nodev1.UpdateNetworkResponse], error) {
	r := req.Msg
	tm, err := teamOf(r)
	if err != nil {
		return nil, err
	}
	var u sandbox.NetworkUpdate
	if err := json.Unmarshal([]byte(r.UpdateJson), &u); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if r.EgressProxyPassword != "" {
		if u.EgressProxy == nil {
			return nil, toConnect(sandboxInvalid("an egress proxy password without an egress proxy"))
		}
		u.EgressProxy.Password = r.EgressProxyPassword
	}
	return reply(&nodev1.UpdateNetworkResponse{}), toConnect(s.m.UpdateNetwork(ctx, tm, r.SandboxId, u))
}

func (s service) NetworkLogs(ctx context.Context, req *connect.Request[nodev1.LogsRequest]) (*connect.Response[nodev1.NetworkLogsResponse], error) {
	r := req.Msg
	tm, err := teamOf(r)
	if err != nil {
		return nil, err
	}
	es, err := s.m.NetworkLogs(ctx, tm, r.SandboxId, unixMS(r.StartUnixMs), int(r.Limit))
	if err != nil {
		return nil, toConnect(err)
	}
	out := &nodev1.NetworkLogsResponse{}
	for _, e := range es {
		b, err := json.Marshal(e)
		if err != nil {
			return nil, toConnect(err)
		}
		out.EntriesJson = append(out.EntriesJson, string(b))
	}
	return reply(out), nil
}
