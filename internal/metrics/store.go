package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/warren-sandbox/warren/internal/store"
)

// Store wraps st so that every call of a store method is timed
// (warren_store_operation_duration_seconds) and its failures counted
// (warren_store_errors_total), by method name. It wraps the interface,
// not the SQL: the time is what callers wait, transactions and retries
// included.
//
// A method added to store.Store later still works through the embedded
// interface, untimed, until it gets its line here; TestStoreTimesEveryMethod
// says which.
func (m *Metrics) Store(st store.Store) store.Store {
	return &timedStore{Store: st, m: m}
}

type timedStore struct {
	store.Store
	m *Metrics
}

// observe records a call of op that started at start and returned *err
// (also when it panicked). Not found and conflict are answers, not
// failures of the store.
func (ts *timedStore) observe(op string, start time.Time, err *error) {
	ts.m.storeTime.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if *err != nil && !errors.Is(*err, store.ErrNotFound) && !errors.Is(*err, store.ErrConflict) {
		ts.m.storeErrors.WithLabelValues(op).Inc()
	}
}

func timed[T any](ts *timedStore, op string, call func() (T, error)) (_ T, err error) {
	defer ts.observe(op, time.Now(), &err)
	return call()
}

func timed0(ts *timedStore, op string, call func() error) (err error) {
	defer ts.observe(op, time.Now(), &err)
	return call()
}

// Unwrap is the store it wraps.
func (ts *timedStore) Unwrap() store.Store { return ts.Store }

func (ts *timedStore) CreateTeam(ctx context.Context, t store.Team) error {
	return timed0(ts, "CreateTeam", func() error { return ts.Store.CreateTeam(ctx, t) })
}

func (ts *timedStore) GetTeam(ctx context.Context, id string) (store.Team, error) {
	return timed(ts, "GetTeam", func() (store.Team, error) { return ts.Store.GetTeam(ctx, id) })
}

func (ts *timedStore) ListTeams(ctx context.Context) ([]store.Team, error) {
	return timed(ts, "ListTeams", func() ([]store.Team, error) { return ts.Store.ListTeams(ctx) })
}

func (ts *timedStore) CreateKey(ctx context.Context, k store.Key) error {
	return timed0(ts, "CreateKey", func() error { return ts.Store.CreateKey(ctx, k) })
}

func (ts *timedStore) KeyByHash(ctx context.Context, kind store.KeyKind, hash string) (store.Key, error) {
	return timed(ts, "KeyByHash", func() (store.Key, error) { return ts.Store.KeyByHash(ctx, kind, hash) })
}

func (ts *timedStore) ListKeys(ctx context.Context, teamID string) ([]store.Key, error) {
	return timed(ts, "ListKeys", func() ([]store.Key, error) { return ts.Store.ListKeys(ctx, teamID) })
}

func (ts *timedStore) RenameKey(ctx context.Context, teamID, id, name string) error {
	return timed0(ts, "RenameKey", func() error { return ts.Store.RenameKey(ctx, teamID, id, name) })
}

func (ts *timedStore) DeleteKey(ctx context.Context, teamID, id string) error {
	return timed0(ts, "DeleteKey", func() error { return ts.Store.DeleteKey(ctx, teamID, id) })
}

func (ts *timedStore) CreateSandbox(ctx context.Context, s store.Sandbox) error {
	return timed0(ts, "CreateSandbox", func() error { return ts.Store.CreateSandbox(ctx, s) })
}

func (ts *timedStore) GetSandbox(ctx context.Context, id string) (store.Sandbox, error) {
	return timed(ts, "GetSandbox", func() (store.Sandbox, error) { return ts.Store.GetSandbox(ctx, id) })
}

func (ts *timedStore) UpdateSandbox(ctx context.Context, id string, update func(*store.Sandbox) error) (store.Sandbox, error) {
	return timed(ts, "UpdateSandbox", func() (store.Sandbox, error) { return ts.Store.UpdateSandbox(ctx, id, update) })
}

func (ts *timedStore) DeleteSandbox(ctx context.Context, id string) error {
	return timed0(ts, "DeleteSandbox", func() error { return ts.Store.DeleteSandbox(ctx, id) })
}

func (ts *timedStore) CountSandboxes(ctx context.Context, f store.SandboxFilter) (map[string]int, error) {
	return timed(ts, "CountSandboxes", func() (map[string]int, error) { return ts.Store.CountSandboxes(ctx, f) })
}

func (ts *timedStore) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]store.Sandbox, error) {
	return timed(ts, "ListSandboxes", func() ([]store.Sandbox, error) { return ts.Store.ListSandboxes(ctx, f) })
}

func (ts *timedStore) ExpiredSandboxes(ctx context.Context, now time.Time) ([]store.Sandbox, error) {
	return timed(ts, "ExpiredSandboxes", func() ([]store.Sandbox, error) { return ts.Store.ExpiredSandboxes(ctx, now) })
}

func (ts *timedStore) CreateTemplate(ctx context.Context, t store.Template) error {
	return timed0(ts, "CreateTemplate", func() error { return ts.Store.CreateTemplate(ctx, t) })
}

func (ts *timedStore) GetTemplate(ctx context.Context, id string) (store.Template, error) {
	return timed(ts, "GetTemplate", func() (store.Template, error) { return ts.Store.GetTemplate(ctx, id) })
}

func (ts *timedStore) TemplateByName(ctx context.Context, teamID, name string) (store.Template, error) {
	return timed(ts, "TemplateByName", func() (store.Template, error) { return ts.Store.TemplateByName(ctx, teamID, name) })
}

func (ts *timedStore) ListTemplates(ctx context.Context, teamID string) ([]store.Template, error) {
	return timed(ts, "ListTemplates", func() ([]store.Template, error) { return ts.Store.ListTemplates(ctx, teamID) })
}

func (ts *timedStore) UpdateTemplate(ctx context.Context, id string, update func(*store.Template) error) (store.Template, error) {
	return timed(ts, "UpdateTemplate", func() (store.Template, error) { return ts.Store.UpdateTemplate(ctx, id, update) })
}

func (ts *timedStore) DeleteTemplate(ctx context.Context, id string) error {
	return timed0(ts, "DeleteTemplate", func() error { return ts.Store.DeleteTemplate(ctx, id) })
}

func (ts *timedStore) CreateBuild(ctx context.Context, b store.Build) error {
	return timed0(ts, "CreateBuild", func() error { return ts.Store.CreateBuild(ctx, b) })
}

func (ts *timedStore) GetBuild(ctx context.Context, id string) (store.Build, error) {
	return timed(ts, "GetBuild", func() (store.Build, error) { return ts.Store.GetBuild(ctx, id) })
}

func (ts *timedStore) UpdateBuild(ctx context.Context, id string, update func(*store.Build) error) (store.Build, error) {
	return timed(ts, "UpdateBuild", func() (store.Build, error) { return ts.Store.UpdateBuild(ctx, id, update) })
}

func (ts *timedStore) ListBuilds(ctx context.Context, templateID string) ([]store.Build, error) {
	return timed(ts, "ListBuilds", func() ([]store.Build, error) { return ts.Store.ListBuilds(ctx, templateID) })
}

func (ts *timedStore) BuildsByStatus(ctx context.Context, statuses ...store.BuildStatus) ([]store.Build, error) {
	return timed(ts, "BuildsByStatus", func() ([]store.Build, error) { return ts.Store.BuildsByStatus(ctx, statuses...) })
}

func (ts *timedStore) AppendBuildLogs(ctx context.Context, buildID string, entries ...store.BuildLogEntry) error {
	return timed0(ts, "AppendBuildLogs", func() error { return ts.Store.AppendBuildLogs(ctx, buildID, entries...) })
}

func (ts *timedStore) BuildLogs(ctx context.Context, buildID string, offset, limit int, minLevel string) ([]store.BuildLogEntry, error) {
	return timed(ts, "BuildLogs", func() ([]store.BuildLogEntry, error) {
		return ts.Store.BuildLogs(ctx, buildID, offset, limit, minLevel)
	})
}

func (ts *timedStore) SetTag(ctx context.Context, t store.Tag) error {
	return timed0(ts, "SetTag", func() error { return ts.Store.SetTag(ctx, t) })
}

func (ts *timedStore) GetTag(ctx context.Context, templateID, tag string) (store.Tag, error) {
	return timed(ts, "GetTag", func() (store.Tag, error) { return ts.Store.GetTag(ctx, templateID, tag) })
}

func (ts *timedStore) DeleteTag(ctx context.Context, templateID, tag string) error {
	return timed0(ts, "DeleteTag", func() error { return ts.Store.DeleteTag(ctx, templateID, tag) })
}

func (ts *timedStore) ListTags(ctx context.Context, templateID string) ([]store.Tag, error) {
	return timed(ts, "ListTags", func() ([]store.Tag, error) { return ts.Store.ListTags(ctx, templateID) })
}

func (ts *timedStore) ListSnapshotTemplates(ctx context.Context, f store.SnapshotFilter) ([]store.Template, error) {
	return timed(ts, "ListSnapshotTemplates", func() ([]store.Template, error) { return ts.Store.ListSnapshotTemplates(ctx, f) })
}

func (ts *timedStore) CreateSecret(ctx context.Context, s store.Secret, seal store.Seal) (store.Secret, error) {
	return timed(ts, "CreateSecret", func() (store.Secret, error) { return ts.Store.CreateSecret(ctx, s, seal) })
}

func (ts *timedStore) AddSecretVersion(ctx context.Context, teamID, id string, seal store.Seal, metadata map[string]string) (store.Secret, error) {
	return timed(ts, "AddSecretVersion", func() (store.Secret, error) {
		return ts.Store.AddSecretVersion(ctx, teamID, id, seal, metadata)
	})
}

func (ts *timedStore) GetSecret(ctx context.Context, teamID, idOrName string) (store.Secret, error) {
	return timed(ts, "GetSecret", func() (store.Secret, error) { return ts.Store.GetSecret(ctx, teamID, idOrName) })
}

// SecretValue's sealed value is neither logged nor labelled: only its time.
func (ts *timedStore) SecretValue(ctx context.Context, teamID, name string) (_ store.Secret, _ string, err error) {
	defer ts.observe("SecretValue", time.Now(), &err)
	return ts.Store.SecretValue(ctx, teamID, name)
}

func (ts *timedStore) ListSecrets(ctx context.Context, teamID string, after *store.SecretCursor, limit int) ([]store.Secret, error) {
	return timed(ts, "ListSecrets", func() ([]store.Secret, error) { return ts.Store.ListSecrets(ctx, teamID, after, limit) })
}

func (ts *timedStore) DeleteSecret(ctx context.Context, teamID, id string) error {
	return timed0(ts, "DeleteSecret", func() error { return ts.Store.DeleteSecret(ctx, teamID, id) })
}

func (ts *timedStore) CreateVolume(ctx context.Context, v store.Volume) error {
	return timed0(ts, "CreateVolume", func() error { return ts.Store.CreateVolume(ctx, v) })
}

func (ts *timedStore) GetVolume(ctx context.Context, teamID, id string) (store.Volume, error) {
	return timed(ts, "GetVolume", func() (store.Volume, error) { return ts.Store.GetVolume(ctx, teamID, id) })
}

func (ts *timedStore) VolumeByName(ctx context.Context, teamID, name string) (store.Volume, error) {
	return timed(ts, "VolumeByName", func() (store.Volume, error) { return ts.Store.VolumeByName(ctx, teamID, name) })
}

func (ts *timedStore) VolumeByID(ctx context.Context, id string) (store.Volume, error) {
	return timed(ts, "VolumeByID", func() (store.Volume, error) { return ts.Store.VolumeByID(ctx, id) })
}

func (ts *timedStore) ListVolumes(ctx context.Context, teamID string) ([]store.Volume, error) {
	return timed(ts, "ListVolumes", func() ([]store.Volume, error) { return ts.Store.ListVolumes(ctx, teamID) })
}

func (ts *timedStore) DeleteVolume(ctx context.Context, teamID, id string, stage func() error) error {
	return timed0(ts, "DeleteVolume", func() error { return ts.Store.DeleteVolume(ctx, teamID, id, stage) })
}

func (ts *timedStore) RegisterNode(ctx context.Context, n store.Node) error {
	return timed0(ts, "RegisterNode", func() error { return ts.Store.RegisterNode(ctx, n) })
}

func (ts *timedStore) HeartbeatNode(ctx context.Context, name string, at time.Time, u store.NodeUsage) (store.NodeState, error) {
	return timed(ts, "HeartbeatNode", func() (store.NodeState, error) { return ts.Store.HeartbeatNode(ctx, name, at, u) })
}

func (ts *timedStore) GetNode(ctx context.Context, name string) (store.Node, error) {
	return timed(ts, "GetNode", func() (store.Node, error) { return ts.Store.GetNode(ctx, name) })
}

func (ts *timedStore) ListNodes(ctx context.Context) ([]store.Node, error) {
	return timed(ts, "ListNodes", func() ([]store.Node, error) { return ts.Store.ListNodes(ctx) })
}

func (ts *timedStore) SetNodeState(ctx context.Context, name string, state store.NodeState) error {
	return timed0(ts, "SetNodeState", func() error { return ts.Store.SetNodeState(ctx, name, state) })
}

func (ts *timedStore) ClaimSandbox(ctx context.Context, teamID string, limit int, expires time.Time) (string, error) {
	return timed(ts, "ClaimSandbox", func() (string, error) { return ts.Store.ClaimSandbox(ctx, teamID, limit, expires) })
}

func (ts *timedStore) ReleaseClaim(ctx context.Context, claimID string) error {
	return timed0(ts, "ReleaseClaim", func() error { return ts.Store.ReleaseClaim(ctx, claimID) })
}

func (ts *timedStore) SandboxRoutes(ctx context.Context, seq int64) ([]store.SandboxRoute, int64, error) {
	var next int64
	routes, err := timed(ts, "SandboxRoutes", func() (rs []store.SandboxRoute, err error) {
		rs, next, err = ts.Store.SandboxRoutes(ctx, seq)
		return rs, err
	})
	return routes, next, err
}

func (ts *timedStore) SetDiskUse(ctx context.Context, u store.DiskUse) error {
	return timed0(ts, "SetDiskUse", func() error { return ts.Store.SetDiskUse(ctx, u) })
}

func (ts *timedStore) TeamDiskUsage(ctx context.Context, teamID string) (store.TeamDisk, error) {
	return timed(ts, "TeamDiskUsage", func() (store.TeamDisk, error) { return ts.Store.TeamDiskUsage(ctx, teamID) })
}

// Templates' blobs in the blob store.

func (ts *timedStore) AddBuildBlob(ctx context.Context, b store.BuildBlob) error {
	return timed0(ts, "AddBuildBlob", func() error { return ts.Store.AddBuildBlob(ctx, b) })
}

func (ts *timedStore) BuildBlobs(ctx context.Context, teamID, buildID string) ([]store.BuildBlob, error) {
	return timed(ts, "BuildBlobs", func() ([]store.BuildBlob, error) { return ts.Store.BuildBlobs(ctx, teamID, buildID) })
}

func (ts *timedStore) TeamBuildBlobs(ctx context.Context, teamID string) ([]store.BuildBlob, error) {
	return timed(ts, "TeamBuildBlobs", func() ([]store.BuildBlob, error) { return ts.Store.TeamBuildBlobs(ctx, teamID) })
}

func (ts *timedStore) ReleaseBuildBlobs(ctx context.Context, teamID string) ([]string, error) {
	return timed(ts, "ReleaseBuildBlobs", func() ([]string, error) { return ts.Store.ReleaseBuildBlobs(ctx, teamID) })
}

// Events and webhooks.

func (ts *timedStore) ListSandboxEvents(ctx context.Context, f store.EventFilter) ([]store.SandboxEvent, error) {
	return timed(ts, "ListSandboxEvents", func() ([]store.SandboxEvent, error) { return ts.Store.ListSandboxEvents(ctx, f) })
}

func (ts *timedStore) CreateWebhook(ctx context.Context, w store.Webhook, maxPerTeam int) error {
	return timed0(ts, "CreateWebhook", func() error { return ts.Store.CreateWebhook(ctx, w, maxPerTeam) })
}

func (ts *timedStore) GetWebhook(ctx context.Context, teamID, id string) (store.Webhook, error) {
	return timed(ts, "GetWebhook", func() (store.Webhook, error) { return ts.Store.GetWebhook(ctx, teamID, id) })
}

func (ts *timedStore) ListWebhooks(ctx context.Context, teamID string) ([]store.Webhook, error) {
	return timed(ts, "ListWebhooks", func() ([]store.Webhook, error) { return ts.Store.ListWebhooks(ctx, teamID) })
}

func (ts *timedStore) UpdateWebhook(ctx context.Context, teamID, id string, update func(*store.Webhook) error) (store.Webhook, error) {
	return timed(ts, "UpdateWebhook", func() (store.Webhook, error) { return ts.Store.UpdateWebhook(ctx, teamID, id, update) })
}

func (ts *timedStore) DeleteWebhook(ctx context.Context, teamID, id string) error {
	return timed0(ts, "DeleteWebhook", func() error { return ts.Store.DeleteWebhook(ctx, teamID, id) })
}

func (ts *timedStore) ListWebhookAttempts(ctx context.Context, teamID, webhookID string, limit int) ([]store.DeliveryAttempt, error) {
	return timed(ts, "ListWebhookAttempts", func() ([]store.DeliveryAttempt, error) {
		return ts.Store.ListWebhookAttempts(ctx, teamID, webhookID, limit)
	})
}

func (ts *timedStore) DueWebhooks(ctx context.Context, owner string, now time.Time, limit int) ([]store.DueWebhook, error) {
	return timed(ts, "DueWebhooks", func() ([]store.DueWebhook, error) { return ts.Store.DueWebhooks(ctx, owner, now, limit) })
}

func (ts *timedStore) LeaseWebhook(ctx context.Context, id, owner string, now, until time.Time) (bool, error) {
	return timed(ts, "LeaseWebhook", func() (bool, error) { return ts.Store.LeaseWebhook(ctx, id, owner, now, until) })
}

func (ts *timedStore) ReleaseWebhook(ctx context.Context, id, owner string) error {
	return timed0(ts, "ReleaseWebhook", func() error { return ts.Store.ReleaseWebhook(ctx, id, owner) })
}

func (ts *timedStore) NextDelivery(ctx context.Context, webhookID string) (d store.Delivery, w store.Webhook, ok bool, err error) {
	defer ts.observe("NextDelivery", time.Now(), &err)
	return ts.Store.NextDelivery(ctx, webhookID)
}

func (ts *timedStore) RecordAttempt(ctx context.Context, owner string, a store.DeliveryAttempt, out store.DeliveryOutcome) error {
	return timed0(ts, "RecordAttempt", func() error { return ts.Store.RecordAttempt(ctx, owner, a, out) })
}

func (ts *timedStore) DropDeliveries(ctx context.Context, webhookID string, keep int) (int, error) {
	return timed(ts, "DropDeliveries", func() (int, error) { return ts.Store.DropDeliveries(ctx, webhookID, keep) })
}

func (ts *timedStore) PendingDeliveries(ctx context.Context) (int, error) {
	return timed(ts, "PendingDeliveries", func() (int, error) { return ts.Store.PendingDeliveries(ctx) })
}

func (ts *timedStore) PruneEvents(ctx context.Context, before time.Time) (int, error) {
	return timed(ts, "PruneEvents", func() (int, error) { return ts.Store.PruneEvents(ctx, before) })
}

// Snapshots in the blob store.

func (ts *timedStore) PutSnapshotBlob(ctx context.Context, b store.SnapshotBlob) error {
	return timed0(ts, "PutSnapshotBlob", func() error { return ts.Store.PutSnapshotBlob(ctx, b) })
}

func (ts *timedStore) GetSnapshotBlob(ctx context.Context, teamID, buildID string) (store.SnapshotBlob, error) {
	return timed(ts, "GetSnapshotBlob", func() (store.SnapshotBlob, error) { return ts.Store.GetSnapshotBlob(ctx, teamID, buildID) })
}

func (ts *timedStore) DeleteSnapshotBlob(ctx context.Context, teamID, buildID string) error {
	return timed0(ts, "DeleteSnapshotBlob", func() error { return ts.Store.DeleteSnapshotBlob(ctx, teamID, buildID) })
}

func (ts *timedStore) ListSnapshotBlobs(ctx context.Context) ([]store.SnapshotBlob, error) {
	return timed(ts, "ListSnapshotBlobs", func() ([]store.SnapshotBlob, error) { return ts.Store.ListSnapshotBlobs(ctx) })
}
