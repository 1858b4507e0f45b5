// Package template is the template service: it turns build requests into
// templates, keeps templates' records (names, tags, aliases, builds, build
// logs) and the files uploaded for them, and runs builds: each step in a
// build sandbox of the node, with a per-team layer cache, and the start
// command snapshotted. What a build is made of is internal/buildspec's; a
// Dockerfile is translated by internal/dockerfile; the base comes from
// internal/baseimage or internal/oci.
//
// # Terms
//
// A template is what users name and start sandboxes from. Each build of
// it is a buildspec.Spec (a base, then steps: COPY, RUN, WORKDIR, USER, ENV; then an
// optional start and ready command) that, once ready, is an image.Template
// named by the build ID: read-only layers plus the defaults of its
// sandboxes. Tags point a template's names at builds ("name" means the tag
// "default"); sandboxes resolve a name, name:tag or template ID through
// Resolve.
//
// # A build
//
//	waiting   accepted; files for COPY steps may be uploaded; started by
//	          StartBuild, then queued until one of Config.Concurrency
//	          slots is free
//	building  the base is resolved (a Warren template, an imported image,
//	          or a registry pull), then each step runs in a build sandbox
//	          of the node's runtime over the layers so far, and what the
//	          step wrote becomes a new layer
//	ready     the image.Template is written and the build's tags point at
//	          it
//	error     Build.ReasonMessage/ReasonStep say where ("base", "1"…,
//	          "finalize"); nothing the build made is left but complete,
//	          cached layers
//
// The layer cache: a step's layer ID is a hash of its parent's key and of
// everything that decides the step's result (type, arguments, uploaded
// files' hash, and the user, workdir and environment it runs with), so a
// rebuild with nothing changed finds every layer and logs "cached";
// Spec.Force or a step's Force skips the lookup.
//
// With a start command, the finished layers are started once more, the
// start command is launched, the ready command is re-run until it
// succeeds, and the sandbox is checkpointed (runsc): sandboxes of the
// template are then restored with the start command already running.
//
// Every build's log lines are stored with time, level and step while it
// runs. A restart of warren marks builds that were running as failed
// (Start).
package template

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/buildspec"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/imageblob"
	"github.com/warren-sandbox/warren/internal/keylock"
	"github.com/warren-sandbox/warren/internal/node"
	"github.com/warren-sandbox/warren/internal/store"
)

// Errors wrapped by the package's errors; the API maps them to statuses.
var (
	ErrNotFound  = errors.New("not found")
	ErrInvalid   = buildspec.ErrInvalid
	ErrConflict  = errors.New("conflict")
	ErrForbidden = errors.New("forbidden")
	// ErrUnavailable: a built-in template this node has not built yet.
	ErrUnavailable = errors.New("unavailable")
	// ErrTooLarge: an upload over a limit (413).
	ErrTooLarge = errors.New("too large")
)

// Sealer seals values the API takes and never returns (secret.Sealer).
type Sealer interface {
	Seal(value, context string) (string, error)
	Open(sealed, context string) (string, error)
}

// DefaultBuildDiskMB is Config.BuildDiskMB's default: 10 GiB.
const DefaultBuildDiskMB = 10240

// Config wires a Builder.
type Config struct {
	Store  store.Store
	Images *image.Store
	Node   *node.Node
	// NodeName is recorded on builds. Default "local".
	NodeName string
	// Pull, in a cluster, brings the image of a build made on another
	// node into Images (internal/imagepeer); nil: builds are this
	// node's only.
	Pull func(ctx context.Context, node, imageID string) error
	// Concurrency bounds the builds that run at once; the others wait.
	// Default 2.
	Concurrency int
	// RegistryMirror is asked instead of Docker Hub for docker.io images.
	RegistryMirror string
	// InsecureRegistries ("HOST" or "HOST:PORT", --allow-insecure-registry)
	// may be pulled from over plain HTTP or at loopback, private or
	// link-local addresses; no other registry may (the mirror is allowed
	// too).
	InsecureRegistries []string
	// MaxUploadBytes bounds one uploaded archive (--max-upload-mb).
	// Default 1 GiB.
	MaxUploadBytes int64
	// MaxTemplateUploads and MaxTemplateUploadBytes bound the archives one
	// template keeps. Defaults 256 and 4 × MaxUploadBytes.
	MaxTemplateUploads     int
	MaxTemplateUploadBytes int64
	// StepTimeout bounds one step; ReadyTimeout the wait for the ready
	// command. Defaults 30 min and 2 min.
	StepTimeout  time.Duration
	ReadyTimeout time.Duration
	// Defaults of a template that names no resources: 2 CPUs, 512 MB.
	CPUCount int
	MemoryMB int
	// BuildDiskMB bounds the writable layer of each build sandbox (what
	// one step or the start command may write): past it, writes fail with
	// ENOSPC inside the sandbox and the data dir is safe. Default
	// DefaultBuildDiskMB.
	BuildDiskMB int
	// Sealer keeps the registry credentials of build specs (secret.Sealer):
	// they are stored sealed and opened only to pull. nil: a build that
	// gives credentials is refused.
	Sealer Sealer
	// Observer, if set, is told of every build's end.
	Observer Observer
	// ImageRemoved, if set, is told of each build image a template's
	// delete removes (the sandbox manager drops its warm pool).
	ImageRemoved func(imageID string)
	// Pending, if set, explains why a built-in template this node has
	// not got is not there yet (a build of it under way, or failed: see
	// setup.Background), which a create of it is told; "" means nothing
	// is building it.
	Pending func(name string) string
	Logger  *slog.Logger
}

// Builder keeps templates and runs their builds. Its methods are safe for
// concurrent use.
type Builder struct {
	cfg Config
	log *slog.Logger
	// slots bounds the builds running at once.
	slots chan struct{}
	// uploadKey signs upload URLs; it is kept in the data dir.
	uploadKey []byte
	// uploadMu serialises checking a template's uploads against their
	// bounds with changing them.
	uploadMu sync.Mutex

	mu      sync.Mutex
	running map[string]*runningBuild // by build ID
	closed  bool
	wg      sync.WaitGroup
	// stop ends the sweep of pulled images (Start, with Config.Pull).
	stop chan struct{}
	// sandboxes takes sandboxes' snapshots (UseSandboxes); guarded by mu.
	sandboxes Snapshotter
	// fetching serialises the snapshot fetches from the blob store, by
	// build ID (snapshotblobs.go).
	fetching keylock.Locks
	// imageBlobs keeps built images in the blob store (UseBlobStore);
	// guarded by mu.
	imageBlobs *imageblob.Keeper
}

// New returns a Builder; call Start before serving.
func New(cfg Config) (*Builder, error) {
	if cfg.Store == nil || cfg.Images == nil || cfg.Node == nil {
		return nil, errors.New("template: Store, Images and Node are required")
	}
	if cfg.NodeName == "" {
		cfg.NodeName = "local"
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 2
	}
	if cfg.BuildDiskMB <= 0 {
		cfg.BuildDiskMB = DefaultBuildDiskMB
	}
	if cfg.StepTimeout <= 0 {
		cfg.StepTimeout = 30 * time.Minute
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 2 * time.Minute
	}
	if cfg.CPUCount <= 0 {
		cfg.CPUCount = 2
	}
	if cfg.MemoryMB <= 0 {
		cfg.MemoryMB = 512
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxUploadBytes <= 0 {
		cfg.MaxUploadBytes = defaultMaxUpload
	}
	if cfg.MaxTemplateUploads <= 0 {
		cfg.MaxTemplateUploads = defaultMaxTemplateUploads
	}
	if cfg.MaxTemplateUploadBytes <= 0 {
		cfg.MaxTemplateUploadBytes = 4 * cfg.MaxUploadBytes
	}
	key, err := loadUploadKey(cfg.Images.Dir())
	if err != nil {
		return nil, err
	}
	return &Builder{
		cfg: cfg, log: cfg.Logger, slots: make(chan struct{}, cfg.Concurrency),
		uploadKey: key, running: map[string]*runningBuild{}, stop: make(chan struct{}),
	}, nil
}

// interruptedReason is what a build that a restart cut short says.
const interruptedReason = "the build was interrupted: warren stopped while it ran; start it again"

// Start marks the builds a previous run of warren left waiting or
// building as failed, since nothing runs them any more, and removes the
// uploads it was receiving and the sandbox snapshots it had not recorded. Their build
// sandboxes were removed by the sandbox manager's start (they are not in
// the store), and their unfinished layers by the image store's cleanup.
func (b *Builder) Start(ctx context.Context) error {
	b.removeStaleUploads()
	b.removeOrphanSnapshots(ctx)
	if b.cfg.Pull != nil {
		b.forgetDeletedPulls(ctx)
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			t := time.NewTicker(pulledSweepInterval)
			defer t.Stop()
			for {
				select {
				case <-b.stop:
					return
				case <-t.C:
					b.forgetDeletedPulls(context.Background())
				}
			}
		}()
	}
	builds, err := b.cfg.Store.BuildsByStatus(ctx, store.BuildWaiting, store.BuildBuilding)
	if err != nil {
		return err
	}
	for _, bd := range builds {
		if bd.Node != "" && bd.Node != b.cfg.NodeName {
			continue // another node's
		}
		if bd.Status == store.BuildWaiting && readRecord(bd).Spec == nil {
			continue // not started yet: the client may still upload and start it
		}
		msg := interruptedReason
		if _, err := b.cfg.Store.UpdateBuild(ctx, bd.ID, func(x *store.Build) error {
			x.Status, x.ReasonMessage, x.FinishedAt = store.BuildError, msg, time.Now()
			return nil
		}); err != nil {
			return err
		}
		_ = b.cfg.Store.AppendBuildLogs(ctx, bd.ID, store.BuildLogEntry{Time: time.Now(), Level: "error", Message: msg})
		b.log.Warn("build interrupted by a restart", "build", bd.ID, "template", bd.TemplateID)
	}
	return b.scrubRegistryAuth(ctx)
}

// Close cancels running builds (they end as errors) and waits for them.
func (b *Builder) Close() {
	b.mu.Lock()
	if !b.closed {
		close(b.stop)
	}
	b.closed = true
	for _, r := range b.running {
		r.cancel()
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// runningBuild is a build's goroutine: cancel stops it, done is closed
// once it has cleaned up.
type runningBuild struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// newUUID returns a random (version 4) UUID: build IDs look like E2B's.
func newUUID() string {
	var u [16]byte
	rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:])
}

// sign is the HMAC of the parts, hex.
func (b *Builder) sign(parts ...string) string {
	m := hmac.New(sha256.New, b.uploadKey)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return fmt.Sprintf("%x", m.Sum(nil))
}
