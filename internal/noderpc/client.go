package noderpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/cluster"
	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
	nodev1 "github.com/warren-sandbox/warren/proto/node/v1"
	"github.com/warren-sandbox/warren/proto/node/v1/nodev1connect"
)

// Client asks one node. Its calls take the sandbox manager's arguments;
// their errors wrap the sandbox manager's (ErrNotFound...), or
// sandbox.ErrNodeUnavailable when the node could not be asked.
type Client struct {
	node string
	rpc  nodev1connect.NodeServiceClient
}

// NewTransport is the HTTP transport to a cluster's nodes, signing every
// request with auth for the purpose and node in its context
// (cluster.WithPurpose, cluster.WithTarget): short dial and header timeouts, so that a node that
// died answers "unavailable" within seconds rather than hanging.
func NewTransport(auth *cluster.Auth) http.RoundTripper {
	return auth.Transport(&http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     60 * time.Second,
		DisableCompression:  true,
	})
}

// NewClient returns a client of the node named node at addr (HOST:PORT),
// over transport (NewTransport); its calls are signed for
// cluster.PurposeRPC on that node.
func NewClient(node, addr string, transport http.RoundTripper) *Client {
	hc := &http.Client{Transport: cluster.Bind(transport, cluster.PurposeRPC, node)}
	return &Client{node: node, rpc: nodev1connect.NewNodeServiceClient(hc, "http://"+addr)}
}

// err is a call's error as the api handles it.
func (c *Client) err(err error) error { return fromConnect(c.node, err) }

func msOf(d time.Duration) int64 { return d.Milliseconds() }

// record is the sandbox record a node answered with.
func record(id, js string) (store.Sandbox, error) {
	var rec store.Sandbox
	if err := json.Unmarshal([]byte(js), &rec); err != nil || rec.ID != id {
		return store.Sandbox{}, fmt.Errorf("noderpc: the node answered sandbox %s with a record that does not parse (%v)", id, err)
	}
	return rec, nil
}

// Create starts a sandbox on the node and returns its record. When it
// cannot take the node's answer (no answer in time, the connection broke,
// ctx ended, an answer that does not parse) although the node may have
// made the sandbox, it abandons the create (AbandonCreate), so that the
// node kills what it made rather than run it unseen.
func (c *Client) Create(ctx context.Context, req sandbox.CreateRequest) (store.Sandbox, error) {
	extra, err := json.Marshal(req.Extra)
	if err != nil {
		return store.Sandbox{}, err
	}
	m := &nodev1.CreateSandboxRequest{
		TeamId: req.TeamID.String(), TemplateId: req.TemplateID, TimeoutMs: msOf(req.Timeout),
		Metadata: req.Metadata, EnvVars: req.EnvVars, AutoPause: req.AutoPause, AutoPauseMemory: req.AutoPauseMemory,
		AutoResume: req.AutoResume, Secure: req.Secure, AllowInternetAccess: req.AllowInternetAccess, ExtraJson: string(extra),
		RequestId: newRequestID(),
	}
	if n := req.Extra.Network; n != nil && n.EgressProxy != nil {
		m.EgressProxyPassword = n.EgressProxy.Password
	}
	for _, v := range req.VolumeMounts {
		m.VolumeMounts = append(m.VolumeMounts, &nodev1.VolumeMount{Name: v.Name, Path: v.Path})
	}
	res, err := c.rpc.CreateSandbox(ctx, connect.NewRequest(m))
	if err != nil {
		if answered(err) {
			return store.Sandbox{}, c.err(err)
		}
		return store.Sandbox{}, c.abandon(ctx, req.TeamID.String(), m.RequestId, c.err(err))
	}
	rec, err := record(res.Msg.SandboxId, res.Msg.SandboxJson)
	if err == nil {
		err = ctx.Err() // nobody takes it
	}
	if err != nil {
		return store.Sandbox{}, c.abandon(ctx, req.TeamID.String(), m.RequestId, err)
	}
	return rec, nil
}

// abandonTimeout bounds an AbandonCreate, which is made whether or not
// the create's context lasted.
const abandonTimeout = 5 * time.Second

// abandon asks the node to kill what the create named request made, and
// returns the create's error, with the abandon's if it failed.
func (c *Client) abandon(ctx context.Context, team, request string, createErr error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonTimeout)
	defer cancel()
	_, err := c.rpc.AbandonCreate(ctx, connect.NewRequest(&nodev1.AbandonCreateRequest{TeamId: team, RequestId: request}))
	if err != nil {
		return fmt.Errorf("%w (and abandoning the create on node %s failed, so a sandbox it made may run until its timeout: %v)", createErr, c.node, err)
	}
	return createErr
}

// answered says that a call's error is the node service's own answer
// (it carries an error kind): a create so answered made nothing.
func answered(err error) bool {
	var ce *connect.Error
	return errors.As(err, &ce) && ce.Meta().Get(kindHeader) != ""
}

func (c *Client) Kill(ctx context.Context, teamID team.ID, id string) error {
	_, err := c.rpc.KillSandbox(ctx, connect.NewRequest(&nodev1.KillSandboxRequest{TeamId: teamID.String(), SandboxId: id}))
	return c.err(err)
}

func (c *Client) SetTimeout(ctx context.Context, teamID team.ID, id string, timeout time.Duration) error {
	_, err := c.rpc.SetTimeout(ctx, connect.NewRequest(&nodev1.SetTimeoutRequest{TeamId: teamID.String(), SandboxId: id, TimeoutMs: msOf(timeout)}))
	return c.err(err)
}

func (c *Client) Refresh(ctx context.Context, teamID team.ID, id string, d time.Duration) error {
	_, err := c.rpc.Refresh(ctx, connect.NewRequest(&nodev1.RefreshRequest{TeamId: teamID.String(), SandboxId: id, DurationMs: msOf(d)}))
	return c.err(err)
}

// Connect returns the sandbox's record and whether it was resumed.
func (c *Client) Connect(ctx context.Context, teamID team.ID, id string, timeout time.Duration, memory bool) (store.Sandbox, bool, error) {
	res, err := c.rpc.Connect(ctx, connect.NewRequest(&nodev1.ConnectRequest{TeamId: teamID.String(), SandboxId: id, TimeoutMs: msOf(timeout), Memory: memory}))
	if err != nil {
		return store.Sandbox{}, false, c.err(err)
	}
	rec, err := record(id, res.Msg.SandboxJson)
	return rec, res.Msg.Resumed, err
}

func (c *Client) Pause(ctx context.Context, teamID team.ID, id string, keepMemory bool) (bool, error) {
	res, err := c.rpc.Pause(ctx, connect.NewRequest(&nodev1.PauseRequest{TeamId: teamID.String(), SandboxId: id, KeepMemory: keepMemory}))
	if err != nil {
		return false, c.err(err)
	}
	return res.Msg.Paused, nil
}

func (c *Client) Resume(ctx context.Context, teamID team.ID, id string, opts sandbox.ResumeOptions) (store.Sandbox, error) {
	res, err := c.rpc.Resume(ctx, connect.NewRequest(&nodev1.ResumeRequest{TeamId: teamID.String(), SandboxId: id,
		TimeoutMs: msOf(opts.Timeout), AutoPause: opts.AutoPause, Memory: opts.Memory}))
	if err != nil {
		return store.Sandbox{}, c.err(err)
	}
	return record(id, res.Msg.SandboxJson)
}

// ForkChild is one child of a Fork: its ID, or why it did not start.
type ForkChild struct {
	ID  string
	Err error
}

func (c *Client) Fork(ctx context.Context, teamID team.ID, id string, timeout time.Duration, count int) ([]ForkChild, error) {
	res, err := c.rpc.Fork(ctx, connect.NewRequest(&nodev1.ForkRequest{TeamId: teamID.String(), SandboxId: id, TimeoutMs: msOf(timeout), Count: int32(count)}))
	if err != nil {
		return nil, c.err(err)
	}
	out := make([]ForkChild, len(res.Msg.Children))
	for i, ch := range res.Msg.Children {
		out[i].ID = ch.SandboxId
		if ch.SandboxId == "" {
			out[i].Err = fromKind(ch.ErrorKind, ch.ErrorMessage)
		}
	}
	return out, nil
}

func (c *Client) Metrics(ctx context.Context, teamID team.ID, id string, start, end time.Time) ([]sandbox.Metric, error) {
	res, err := c.rpc.Metrics(ctx, connect.NewRequest(&nodev1.MetricsRequest{TeamId: teamID.String(), SandboxId: id,
		StartUnixMs: start.UnixMilli(), EndUnixMs: end.UnixMilli()}))
	if err != nil {
		return nil, c.err(err)
	}
	out := make([]sandbox.Metric, 0, len(res.Msg.Metrics))
	for _, m := range res.Msg.Metrics {
		out = append(out, sandbox.Metric{Time: unixMS(m.TimeUnixMs), CPUCount: int(m.CpuCount), CPUUsedPct: m.CpuUsedPct,
			MemUsed: m.MemUsed, MemTotal: m.MemTotal, MemCache: m.MemCache, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal})
	}
	return out, nil
}

func (c *Client) Logs(ctx context.Context, teamID team.ID, id string, start time.Time, limit int) ([]sandbox.LogEntry, error) {
	res, err := c.rpc.Logs(ctx, connect.NewRequest(&nodev1.LogsRequest{TeamId: teamID.String(), SandboxId: id, StartUnixMs: start.UnixMilli(), Limit: int32(limit)}))
	if err != nil {
		return nil, c.err(err)
	}
	out := make([]sandbox.LogEntry, 0, len(res.Msg.Entries))
	for _, e := range res.Msg.Entries {
		out = append(out, sandbox.LogEntry{Time: unixMS(e.TimeUnixMs), Level: e.Level, Message: e.Message, Fields: e.Fields, Line: e.Line})
	}
	return out, nil
}

func (c *Client) UpdateNetwork(ctx context.Context, teamID team.ID, id string, u sandbox.NetworkUpdate) error {
	b, err := json.Marshal(u)
	if err != nil {
		return err
	}
	m := &nodev1.UpdateNetworkRequest{TeamId: teamID.String(), SandboxId: id, UpdateJson: string(b)}
	if u.EgressProxy != nil {
		m.EgressProxyPassword = u.EgressProxy.Password
	}
	_, err = c.rpc.UpdateNetwork(ctx, connect.NewRequest(m))
	return c.err(err)
}

func (c *Client) NetworkLogs(ctx context.Context, teamID team.ID, id string, start time.Time, limit int) ([]egress.Entry, error) {
	res, err := c.rpc.NetworkLogs(ctx, connect.NewRequest(&nodev1.LogsRequest{TeamId: teamID.String(), SandboxId: id, StartUnixMs: start.UnixMilli(), Limit: int32(limit)}))
	if err != nil {
		return nil, c.err(err)
	}
	out := make([]egress.Entry, 0, len(res.Msg.EntriesJson))
	for _, s := range res.Msg.EntriesJson {
		var e egress.Entry
		if err := json.Unmarshal([]byte(s), &e); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}
