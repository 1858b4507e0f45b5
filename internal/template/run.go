package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/baseimage"
	"github.com/warren-sandbox/warren/internal/buildspec"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/node"
	"github.com/warren-sandbox/warren/internal/oci"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
)

// StartBuild starts a waiting build of the team's template with spec.
// It returns once the build is queued; Status follows it.
func (b *Builder) StartBuild(ctx context.Context, teamID, templateID, buildID string, spec buildspec.Spec) error {
	t, _, err := b.owned(ctx, teamID, templateID)
	if err != nil {
		return err
	}
	if err := b.validate(t.ID, &spec); err != nil {
		return err
	}
	sealed, err := b.sealRegistryAuth(t.TeamID, buildID, &spec)
	if err != nil {
		return err
	}
	var rec buildRecord
	bd, err := b.cfg.Store.UpdateBuild(ctx, buildID, func(bd *store.Build) error {
		if bd.TemplateID != t.ID {
			return fmt.Errorf("%w: build %s of template %s", ErrNotFound, buildID, templateID)
		}
		rec = readRecord(*bd)
		if bd.Status != store.BuildWaiting || rec.Spec != nil {
			return fmt.Errorf("%w: build %s was already started", ErrConflict, buildID)
		}
		rec.Spec, rec.RegistrySealed = &spec, sealed
		bd.Spec = rec.String()
		bd.Node = b.cfg.NodeName
		bd.UpdatedAt = time.Now()
		return nil
	})
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: build %s of template %s", ErrNotFound, buildID, templateID)
	}
	if err != nil {
		return err
	}
	return b.launch(bd, t, rec)
}

// validate checks a spec before a build is started with it: its form,
// and that the files of its COPY steps were uploaded.
func (b *Builder) validate(templateID string, s *buildspec.Spec) error {
	if err := s.Validate(); err != nil {
		return err
	}
	for i, st := range s.Steps {
		if st.Type != "COPY" {
			continue
		}
		if _, err := os.Stat(b.uploadPath(templateID, st.FilesHash)); err != nil {
			return fmt.Errorf("%w: step %d (COPY): its files (hash %s) were not uploaded: upload them first (GET /templates/%s/files/%s gives the URL)",
				ErrInvalid, i+1, st.FilesHash, templateID, st.FilesHash)
		}
	}
	return nil
}

// launch runs the build in the background, once a slot is free.
func (b *Builder) launch(bd store.Build, t store.Template, rec buildRecord) error {
	ctx, cancel := context.WithCancel(context.Background())
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		cancel()
		return fmt.Errorf("%w: the server is shutting down", ErrConflict)
	}
	r := &runningBuild{cancel: cancel, done: make(chan struct{})}
	b.running[bd.ID] = r
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		defer func() {
			b.mu.Lock()
			delete(b.running, bd.ID)
			b.mu.Unlock()
			cancel()
			close(r.done)
		}()
		b.runBuild(ctx, bd, t, rec)
	}()
	return nil
}

// failure is a build error with the step it happened in.
type failure struct {
	step string
	err  error
}

func (f *failure) Error() string { return f.err.Error() }

func failAt(step string, err error) error { return &failure{step, err} }

// runBuild runs a build to its end and records the result.
func (b *Builder) runBuild(ctx context.Context, bd store.Build, t store.Template, rec buildRecord) {
	lg := newBuildLog(b.cfg.Store, bd.ID)
	bg := context.WithoutCancel(ctx)
	begin := time.Now()
	finish := func(err error) {
		defer b.observeBuild(ctx, begin, err)
		now := time.Now()
		var f *failure
		step := ""
		if errors.As(err, &f) {
			step = f.step
		}
		if err != nil {
			if ctx.Err() != nil {
				err = fmt.Errorf("the build was cancelled (template deleted or server stopping): %w", err)
			}
			lg.setStep(step)
			lg.errorf("build failed: %v", err)
		}
		lg.close() // every line is stored before the status says the build ended
		_, uerr := b.cfg.Store.UpdateBuild(bg, bd.ID, func(x *store.Build) error {
			x.UpdatedAt, x.FinishedAt = now, now
			if err != nil {
				x.Status, x.ReasonMessage, x.ReasonStep = store.BuildError, err.Error(), step
			} else {
				x.Status = store.BuildReady
			}
			return nil
		})
		if uerr != nil {
			b.log.Error("recording a build's end", "build", bd.ID, "err", uerr)
		}
		if err == nil {
			for _, tag := range rec.Tags {
				if terr := b.cfg.Store.SetTag(bg, store.Tag{TemplateID: t.ID, Tag: tag, BuildID: bd.ID, CreatedAt: now}); terr != nil {
					b.log.Error("tagging a build", "build", bd.ID, "tag", tag, "err", terr)
				}
			}
			b.pruneUploads(bg, t.ID, *rec.Spec)
			b.recordDisk(store.DiskTemplate, t, bd.ID)
		}
	}

	select {
	case b.slots <- struct{}{}:
	case <-ctx.Done():
		finish(ctx.Err())
		return
	}
	defer func() { <-b.slots }()
	started := time.Now()
	if _, err := b.cfg.Store.UpdateBuild(bg, bd.ID, func(x *store.Build) error {
		x.Status, x.UpdatedAt = store.BuildBuilding, started
		return nil
	}); err != nil {
		finish(err)
		return
	}
	lg.info("building template %s (build %s), %d steps", t.ID, bd.ID, len(rec.Spec.Steps))
	img, err := b.run(ctx, lg, bd, t, *rec.Spec, rec.RegistrySealed)
	if err == nil {
		// Durable before it is ready: the image outlives this node.
		lg.setStep("finalize")
		if err = b.storeImage(ctx, lg, t, bd, img); err != nil {
			err = failAt("finalize", fmt.Errorf("storing the image in the blob store: %w", err))
		}
	}
	if err == nil {
		if err = b.cfg.Images.PutTemplate(img); err != nil {
			err = failAt("finalize", err)
		}
	}
	if err == nil {
		lg.setStep("finalize")
		lg.info("template %s ready in %.1fs", t.ID, time.Since(started).Seconds())
	}
	finish(err)
}

// state is what a build has made so far: the base and the steps' layers,
// and what later steps and the template's sandboxes run with.
type state struct {
	layers  []string
	user    string
	workdir string
	envs    map[string]string
	// key identifies everything so far, for the layer cache.
	key string
}

func (s *state) template(id string) *image.Template {
	envs := make(map[string]string, len(s.envs))
	for k, v := range s.envs {
		envs[k] = v
	}
	return &image.Template{ID: id, Layers: slices.Clone(s.layers), User: s.user, Workdir: s.workdir, Envs: envs}
}

// cacheScope is what a team's cache keys start from. A cached layer is
// whatever its step wrote when it was first built, so a key that another
// team could reach would let that team build a step under this team's
// inputs first and have its own files taken; keys of different teams
// never meet. A base's layers (the built-in base, an image) are shared:
// they are inputs, not cache entries. There is no key for no team.
func cacheScope(teamID string) (string, error) {
	if teamID == "" {
		return "", errors.New("the template belongs to no team: the layer cache is per team, so it cannot be built")
	}
	h := sha256.Sum256([]byte("team\x00" + teamID))
	return hex.EncodeToString(h[:]), nil
}

// chain extends the cache key with a step and what it runs with.
func (s *state) chain(parts ...string) string {
	h := sha256.New()
	h.Write([]byte(s.key))
	keys := make([]string, 0, len(s.envs))
	for k := range s.envs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	ctx := []string{"user=" + s.user, "workdir=" + s.workdir}
	for _, k := range keys {
		ctx = append(ctx, "env="+k+"="+s.envs[k])
	}
	b, _ := json.Marshal([][]string{parts, ctx})
	h.Write(b)
	s.key = hex.EncodeToString(h.Sum(nil))
	return s.key
}

// run resolves the base, runs the steps and the start command, and
// returns the template (named by the build ID) they make. registrySealed
// holds the base image's registry credentials (sealRegistryAuth).
func (b *Builder) run(ctx context.Context, lg *buildLog, bd store.Build, t store.Template, spec buildspec.Spec, registrySealed string) (*image.Template, error) {
	lg.setStep("base")
	scope, err := cacheScope(t.TeamID)
	if err != nil {
		return nil, failAt("base", err)
	}
	creds := func() (*buildspec.RegistryAuth, error) { return b.openRegistryAuth(t.TeamID, bd.ID, registrySealed) }
	st, err := b.base(ctx, lg, t.TeamID, spec, creds)
	if err != nil {
		return nil, failAt("base", err)
	}
	st.key = scope
	st.chain(append([]string{"base"}, st.layers...)...)
	for i, step := range spec.Steps {
		name := strconv.Itoa(i + 1)
		lg.setStep(name)
		if err := ctx.Err(); err != nil {
			return nil, failAt(name, err)
		}
		if err := b.step(ctx, lg, st, t.ID, bd, step, spec.Force || step.Force); err != nil {
			return nil, failAt(name, err)
		}
	}
	img := st.template(bd.ID)
	img.StartCmd, img.ReadyCmd = spec.StartCmd, spec.ReadyCmd
	if spec.StartCmd != "" {
		lg.setStep("finalize")
		if err := b.snapshot(ctx, lg, st, bd, img, spec.Force); err != nil {
			return nil, failAt("finalize", err)
		}
	}
	return img, nil
}

// baseImage is the SDK's default image, which is Warren's base template
// unless a registry mirror provides it.
const baseImage = "e2bdev/base"

// base resolves the build's base into the state steps start from; creds
// opens the registry credentials, if the spec has any.
func (b *Builder) base(ctx context.Context, lg *buildLog, teamID string, spec buildspec.Spec, creds func() (*buildspec.RegistryAuth, error)) (*state, error) {
	var img *image.Template
	ref := spec.FromTemplate
	if ref == "" && !strings.Contains(spec.FromImage, "/") {
		ref = spec.FromImage // a Dockerfile's FROM may name a Warren template (FROM base)
	}
	if ref != "" {
		r, err := b.Resolve(ctx, teamID, ref)
		switch {
		case err == nil:
			lg.info("FROM template %s", ref)
			img = r.Image
		case spec.FromTemplate != "" || !errors.Is(err, ErrNotFound):
			return nil, err
		}
	}
	if img == nil {
		lg.info("FROM image %s", spec.FromImage)
		var err error
		if img, err = b.fromImage(ctx, lg, teamID, spec, creds); err != nil {
			return nil, err
		}
	}
	if len(img.Layers) == 0 {
		return nil, errors.New("the base has no layers")
	}
	st := &state{layers: slices.Clone(img.Layers), user: img.User, workdir: img.Workdir, envs: map[string]string{}}
	for k, v := range img.Envs {
		st.envs[k] = v
	}
	return st, nil
}

// fromImage finds an image: Warren's base for e2bdev/base, an image
// imported with `warren image import`, or a registry pull.
func (b *Builder) fromImage(ctx context.Context, lg *buildLog, teamID string, spec buildspec.Spec, creds func() (*buildspec.RegistryAuth, error)) (*image.Template, error) {
	ref := spec.FromImage
	repo, _, _ := strings.Cut(ref, "@")
	if i := strings.LastIndexByte(repo, ':'); i > strings.LastIndexByte(repo, '/') {
		repo = repo[:i]
	}
	repo = strings.TrimPrefix(strings.TrimPrefix(repo, "docker.io/"), "index.docker.io/")
	if repo == baseImage && b.cfg.RegistryMirror == "" {
		lg.info("%s is Warren's base template", ref)
		return b.cfg.Images.Template(baseimage.TemplateID)
	}
	if img, err := oci.ImportedImage(b.cfg.Images, ref); err == nil {
		lg.info("using the imported image %s", ref)
		return img, nil
	}
	// The team's pulls reuse only the team's layers (oci.PullOptions.Team).
	opts := oci.PullOptions{Team: teamID, Mirror: b.cfg.RegistryMirror, AllowInsecure: b.cfg.InsecureRegistries, Progress: lg.info}
	if spec.FromImageRegistry != nil {
		// Opened here, where the pull happens, and nowhere else.
		a, err := creds()
		if err != nil {
			return nil, err
		}
		switch a.Type {
		case "registry", "":
			opts.Username, opts.Password = a.Username, a.Password
		case "gcp":
			// Google's registries take a service account key as the
			// password of the user _json_key.
			opts.Username, opts.Password = "_json_key", a.ServiceAccountJSON
		case "aws":
			return nil, errors.New("AWS ECR credentials are not supported: pass a registry username and password instead (user AWS, password from `aws ecr get-login-password`)")
		default:
			return nil, fmt.Errorf("unknown registry credentials type %q", a.Type)
		}
	}
	img, err := oci.Pull(ctx, b.cfg.Images, ref, opts)
	if err != nil && repo == baseImage {
		lg.warn("the mirror does not provide %s (%v); using Warren's base template", ref, err)
		return b.cfg.Images.Template(baseimage.TemplateID)
	}
	return img, err
}

// step runs one build step, changing st.
func (b *Builder) step(ctx context.Context, lg *buildLog, st *state, templateID string, bd store.Build, s buildspec.Step, force bool) error {
	switch s.Type {
	case "ENV":
		for i := 0; i+1 < len(s.Args); i += 2 {
			st.envs[s.Args[i]] = s.Args[i+1]
		}
		st.chain("ENV", strings.Join(s.Args, "\x00"))
		lg.info("ENV %s", strings.Join(s.Args, " "))
		return nil
	case "USER":
		st.user = s.Args[0]
		st.chain("USER", s.Args[0])
		lg.info("USER %s", s.Args[0])
		return nil
	case "WORKDIR":
		dir := s.Args[0]
		if !path.IsAbs(dir) {
			dir = path.Join("/", st.workdir, dir)
		}
		owner := st.user
		lg.info("WORKDIR %s", dir)
		err := b.layerStep(ctx, lg, st, bd, force, []string{"WORKDIR", dir}, func(c *envdClient) error {
			// Made for the user who will work in it, as E2B does.
			script := `[ -d "$1" ] && exit 0; mkdir -p "$1" && if [ -n "$2" ]; then chown "$2:" "$1" 2>/dev/null || chown "$2" "$1"; fi`
			return b.exec(ctx, lg, c, execSpec{User: "root", Cwd: "/", Envs: st.envs, Script: script, Args: []string{dir, owner}})
		})
		st.workdir = dir
		return err
	case "RUN":
		user := st.user
		if len(s.Args) > 1 && s.Args[1] != "" {
			user = s.Args[1]
		}
		lg.info("RUN %s", s.Args[0])
		return b.layerStep(ctx, lg, st, bd, force, []string{"RUN", s.Args[0], user}, func(c *envdClient) error {
			return b.exec(ctx, lg, c, execSpec{User: user, Cwd: st.workdir, Envs: st.envs, Script: s.Args[0]})
		})
	case "COPY":
		src, dest := s.Args[0], s.Args[1]
		user, mode := st.user, ""
		if len(s.Args) > 2 && s.Args[2] != "" {
			user = s.Args[2]
		}
		if len(s.Args) > 3 {
			mode = s.Args[3]
		}
		// A relative destination is taken from the working directory RUN
		// steps run in: the workdir, else (as in E2B's builder) the home
		// of the step's user, which only the build sandbox knows (the
		// copy script looks it up).
		if !path.IsAbs(dest) && st.workdir != "" {
			d := path.Join(st.workdir, dest)
			if strings.HasSuffix(dest, "/") {
				d += "/"
			}
			dest = d
		}
		lg.info("COPY %s %s", src, dest)
		// The key names the archive by its content, not by FilesHash:
		// the SDK's hash cannot be recomputed from the upload (it covers
		// the step's destination and each directory's st_size, which the
		// archive does not carry), so a client could name any files by a
		// hash another build of the team uses. The file stays open: what
		// is hashed is what is copied, even if it is replaced meanwhile.
		archive, err := os.Open(b.uploadPath(templateID, s.FilesHash))
		if err != nil {
			return fmt.Errorf("the uploaded files of hash %s: %w", s.FilesHash, err)
		}
		defer archive.Close()
		digest, gz, err := archiveDigest(archive)
		if err != nil {
			return fmt.Errorf("the uploaded files of hash %s: %w", s.FilesHash, err)
		}
		key := []string{"COPY", src, dest, user, mode, "sha256:" + digest}
		if !path.IsAbs(dest) {
			// Layers cached before relative meant the user's home (it
			// meant /) must not be taken for this one.
			key = append(key, "relative-to-home")
		}
		return b.layerStep(ctx, lg, st, bd, force, key, func(c *envdClient) error {
			inSandbox := "/tmp/.warren-copy-" + digest
			if _, err := archive.Seek(0, io.SeekStart); err != nil {
				return err
			}
			if err := c.upload(ctx, archive, inSandbox); err != nil {
				return err
			}
			return b.exec(ctx, lg, c, execSpec{User: "root", Cwd: "/", Script: copyScript,
				Args: []string{inSandbox, strconv.FormatBool(gz), src, dest, user, mode, st.user}})
		})
	}
	return fmt.Errorf("unknown step type %q", s.Type)
}

// archiveDigest is the hex SHA-256 of an uploaded archive's bytes, and
// whether it is gzip'd.
func archiveDigest(f *os.File) (string, bool, error) {
	var head [2]byte
	if _, err := f.ReadAt(head[:], 0); err != nil {
		return "", false, err
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, 1<<62)); err != nil {
		return "", false, err
	}
	return hex.EncodeToString(h.Sum(nil)), head[0] == 0x1f && head[1] == 0x8b, nil
}

// copyScript runs as root in the build sandbox: it unpacks the archive
// ($1, gzip'd if $2) and copies what src ($3, a glob) matches to dest
// ($4) the way COPY does (a directory's contents, a file into a
// directory or to a path), then gives it to the user ($5) and sets the
// mode ($6) if given. Directories it has to make belong to the user too,
// so that a user's COPY into a new directory can be worked in. A relative
// dest is under the home of the build's user ($7, a name or uid; root if
// empty), where RUN steps run without a WORKDIR: /etc/passwd is read
// with the shell alone, since an image need not have getent or awk.
const copyScript = `set -eu
archive="$1"; gz="$2"; src="$3"; dest="$4"; owner="$5"; mode="$6"; ctxuser="${7:-root}"
case "$dest" in
/*) ;;
*)
  who="${ctxuser%%:*}"; home=""
  if [ -r /etc/passwd ]; then
    while IFS=: read -r pname _ puid _ _ phome _; do
      if [ "$pname" = "$who" ] || [ "$puid" = "$who" ]; then home="$phome"; break; fi
    done < /etc/passwd
  fi
  case "$home" in /*) ;; *) home=/ ;; esac
  dest="${home%/}/$dest" ;;
esac
give() { if [ -n "$owner" ]; then chown -R "$owner:" "$1" 2>/dev/null || chown -R "$owner" "$1"; else chown -R 0:0 "$1"; fi; }
mkdirs() {
  d="$1"; top=""
  while [ ! -e "$d" ]; do top="$d"; d=$(dirname "$d"); done
  mkdir -p "$1"
  if [ -n "$top" ]; then give "$top"; fi
}
ctx=$(mktemp -d)
if [ "$gz" = true ]; then tar -xzf "$archive" -C "$ctx"; else tar -xf "$archive" -C "$ctx"; fi
rm -f "$archive"
cd "$ctx"
set +f
set -- $src
set -f
n=0
for m in "$@"; do
  if [ ! -e "$m" ] && [ ! -L "$m" ]; then echo "COPY: nothing matches $src in the uploaded files" >&2; exit 1; fi
  n=$((n+1))
done
todir=false
case "$dest" in */) todir=true ;; esac
if [ "$n" -gt 1 ] || [ -d "$dest" ]; then todir=true; fi
for m in "$@"; do
  if [ -d "$m" ] && [ ! -L "$m" ]; then
    mkdirs "$dest"; cp -a "$m/." "$dest/"; target="$dest"
  elif [ "$todir" = true ]; then
    mkdirs "$dest"; cp -a "$m" "$dest/"; target="${dest%/}/$(basename "$m")"
  else
    mkdirs "$(dirname "$dest")"; cp -a "$m" "$dest"; target="$dest"
  fi
  give "$target"
  if [ -n "$mode" ]; then chmod -R "$mode" "$target"; fi
  echo "copied $m to $target"
done
cd /
rm -rf "$ctx"
`

// exec runs a command in the build sandbox, logging its output; a
// non-zero exit is an error.
func (b *Builder) exec(ctx context.Context, lg *buildLog, c *envdClient, e execSpec) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.StepTimeout)
	defer cancel()
	e.Output = lg.output
	code, err := c.run(ctx, e)
	lg.commandDone()
	if err != nil {
		if ctx.Err() == context.DeadlineExceeded {
			return fmt.Errorf("the step ran longer than %s", b.cfg.StepTimeout)
		}
		return err
	}
	if code != 0 {
		return fmt.Errorf("the command exited with code %d", code)
	}
	return nil
}

// layerStep makes the layer of a step that changes files: from the cache
// when its key has a layer (unless force), else by running do in a build
// sandbox over the layers so far and keeping what it wrote.
func (b *Builder) layerStep(ctx context.Context, lg *buildLog, st *state, bd store.Build, force bool, parts []string, do func(*envdClient) error) error {
	layerID := "step-" + st.chain(parts...)[:40]
	if !force && b.cfg.Images.HasLayer(layerID) {
		lg.info("cached")
		st.layers = append(st.layers, layerID)
		return nil
	}
	start := time.Now()
	inst, c, err := b.sandbox(ctx, bd.ID, bd.CPUCount, bd.MemoryMB, st.layers, "", "", newToken())
	if err != nil {
		return err
	}
	if err := do(c); err != nil {
		c.close()
		b.remove(inst)
		return err
	}
	c.close()
	if err := b.cfg.Node.Commit(context.WithoutCancel(ctx), inst, layerID); err != nil {
		return fmt.Errorf("keeping the step's files: %w", err)
	}
	st.layers = append(st.layers, layerID)
	lg.info("done in %.1fs", time.Since(start).Seconds())
	return nil
}

// sandbox starts a build sandbox over layers (IDs). Its writable layer is
// limited to Config.BuildDiskMB like any sandbox's (its own ext4 disk),
// and node.Commit copies it into a layer; token is envd's, a fresh one
// for each sandbox (newToken).
func (b *Builder) sandbox(ctx context.Context, imageID string, cpus, memMB int, layers []string, user, workdir, token string) (*node.Instance, *envdClient, error) {
	dirs, err := b.cfg.Images.LayerDirs(&image.Template{ID: imageID, Layers: layers})
	if err != nil {
		return nil, nil, err
	}
	if user == "" {
		user = "root"
	}
	inst, err := b.cfg.Node.Create(ctx, node.CreateRequest{
		ID: sandbox.NewID(), Layers: dirs, CPUCount: cpus, MemoryMB: memMB,
		DiskSizeMB: b.cfg.BuildDiskMB, AccessToken: token, User: user, Workdir: workdir,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("starting a build sandbox: %w", err)
	}
	return inst, newEnvdClient(inst, token), nil
}

func (b *Builder) remove(inst *node.Instance) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.cfg.Node.Delete(ctx, inst); err != nil {
		b.log.Error("removing a build sandbox", "sandbox", inst.ID, "err", err)
	}
}

// snapshot starts the template's sandbox, runs its start command until
// the ready command succeeds, and checkpoints it, so that its sandboxes
// are restored with the start command running (takeStartSnapshot).
func (b *Builder) snapshot(ctx context.Context, lg *buildLog, st *state, bd store.Build, img *image.Template, force bool) error {
	// Snapshots are cached like layers: the same layers and commands give
	// the same snapshot (its image and its layer share the ID).
	// A forced one gets an ID of its own: the cached one may be in use.
	nonce := ""
	if force {
		nonce = bd.ID
	}
	snapID := "snap-" + st.chain("START", img.StartCmd, img.ReadyCmd, b.cfg.Node.Runtime().Name(), nonce)[:40]
	if !force {
		if token, ok := b.cachedSnapshot(snapID); ok {
			lg.info("cached")
			img.Layers = append(img.Layers, snapID)
			img.Snapshot, img.SnapshotToken = snapID, token
			return nil
		}
	}
	token, err := b.takeStartSnapshot(ctx, lg, startSnapshot{ID: snapID, Image: img, CPUCount: bd.CPUCount, MemoryMB: bd.MemoryMB})
	if err != nil {
		return err
	}
	img.Layers = append(img.Layers, snapID)
	img.Snapshot, img.SnapshotToken = snapID, token
	return nil
}

// cachedSnapshot returns the envd token of start snapshot snapID if it
// is whole: its layer (committed last) and its checkpoint image exist.
func (b *Builder) cachedSnapshot(snapID string) (string, bool) {
	if !b.cfg.Images.HasLayer(snapID) || !b.cfg.Images.HasSnapshot(snapID) {
		return "", false
	}
	token, err := b.snapshotToken(snapID)
	return token, err == nil
}

// startSnapshot is a start snapshot to take: ID names its checkpoint
// image and its layer; Image gives the layers it starts over, the user,
// workdir and environment of its commands, its start command (none: the
// image's envd starts what it needs itself) and its ready command.
type startSnapshot struct {
	ID                 string
	Image              *image.Template
	CPUCount, MemoryMB int
}

// takeStartSnapshot starts a sandbox over s.Image's layers, runs its start
// command until its ready command succeeds, and checkpoints it into
// s.ID's snapshot directory. What the sandbox wrote becomes layer s.ID,
// committed after the checkpoint image: an existing layer means both are
// whole. It returns the token of the envd inside, which restores need.
// The runtime must be able to checkpoint.
func (b *Builder) takeStartSnapshot(ctx context.Context, lg *buildLog, s startSnapshot) (string, error) {
	img := s.Image
	if !b.cfg.Node.Runtime().Capabilities().Checkpoint {
		return "", fmt.Errorf("a start command needs checkpoints, which the %s runtime cannot do here: %s",
			b.cfg.Node.Runtime().Name(), b.cfg.Node.Runtime().Capabilities().CheckpointDetail)
	}
	if img.StartCmd != "" {
		lg.info("starting: %s", img.StartCmd)
	}
	// The envd in the snapshot keeps this token: the template records it
	// (SnapshotToken), the sandbox manager authenticates a restored
	// sandbox's /init with it, and /init gives the sandbox its own.
	token := newToken()
	inst, c, err := b.sandbox(ctx, img.ID, s.CPUCount, s.MemoryMB, img.Layers, img.User, img.Workdir, token)
	if err != nil {
		return "", err
	}
	defer c.close()
	keep := false
	defer func() {
		if !keep {
			b.remove(inst)
		}
	}()
	startCtx, stopStream := context.WithCancel(ctx)
	defer stopStream()
	var exited chan error // nil without a start command: it never exits
	if img.StartCmd != "" {
		stream, err := c.start(startCtx, execSpec{User: img.User, Cwd: img.Workdir, Envs: img.Envs, Script: img.StartCmd})
		if err != nil {
			return "", fmt.Errorf("starting the start command: %w", err)
		}
		exited = make(chan error, 1)
		go func() {
			code, err := wait(stream, lg.output)
			if err == nil {
				err = fmt.Errorf("the start command exited with code %d before the template was ready", code)
			}
			exited <- err
		}()
	}
	if err := b.waitReady(ctx, lg, c, img, exited); err != nil {
		return "", err
	}
	// Leaving the stream does not stop the process: it belongs to the
	// sandbox, not to the client.
	stopStream()
	lg.info("ready; taking the snapshot")
	dir := b.cfg.Images.SnapshotDir(s.ID)
	_ = b.cfg.Images.RemoveSnapshot(s.ID)
	if err := b.cfg.Node.Checkpoint(context.WithoutCancel(ctx), inst, dir, false); err != nil {
		_ = b.cfg.Images.RemoveSnapshot(s.ID)
		return "", fmt.Errorf("checkpointing: %w", err)
	}
	keep = true
	if err := writeSnapshotToken(dir, token); err != nil {
		b.remove(inst)
		_ = b.cfg.Images.RemoveSnapshot(s.ID)
		return "", fmt.Errorf("keeping the snapshot's envd token: %w", err)
	}
	if err := b.cfg.Node.Commit(context.WithoutCancel(ctx), inst, s.ID); err != nil {
		_ = b.cfg.Images.RemoveSnapshot(s.ID)
		return "", fmt.Errorf("keeping the started sandbox's files: %w", err)
	}
	return token, nil
}

// snapshotTokenFile, in a snapshot's directory, holds the access token of
// the envd inside it, so that a build that finds the snapshot cached can
// record it too. A snapshot without one is not reused.
const snapshotTokenFile = "warren-envd-token"

func writeSnapshotToken(dir, token string) error {
	return os.WriteFile(filepath.Join(dir, snapshotTokenFile), []byte(token), 0o600)
}

func (b *Builder) snapshotToken(snapID string) (string, error) {
	t, err := os.ReadFile(filepath.Join(b.cfg.Images.SnapshotDir(snapID), snapshotTokenFile))
	if err != nil {
		return "", err
	}
	if len(t) == 0 {
		return "", errors.New("empty envd token")
	}
	return string(t), nil
}

// readyPoll is how often the ready command is re-run.
const readyPoll = 500 * time.Millisecond

// waitReady re-runs the ready command until it succeeds (or, without
// one, waits a moment to see the start command keep running).
func (b *Builder) waitReady(ctx context.Context, lg *buildLog, c *envdClient, img *image.Template, exited <-chan error) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.ReadyTimeout)
	defer cancel()
	if img.ReadyCmd == "" {
		select {
		case err := <-exited:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
			lg.info("no ready command: the start command has run for 1s")
			return nil
		}
	}
	lg.info("waiting for: %s", img.ReadyCmd)
	for attempt := 1; ; attempt++ {
		var out []byte
		code, err := c.run(ctx, execSpec{User: img.User, Cwd: img.Workdir, Envs: img.Envs, Script: img.ReadyCmd,
			Output: func(_ bool, b []byte) {
				if len(out) < 4096 {
					out = append(out, b...)
				}
			}})
		if err == nil && code == 0 {
			lg.output(false, out)
			lg.info("the ready command succeeded (attempt %d)", attempt)
			return nil
		}
		select {
		case err := <-exited:
			lg.output(false, out)
			return err
		case <-ctx.Done():
			lg.output(false, out)
			return fmt.Errorf("the ready command did not succeed within %s (last exit code %d)", b.cfg.ReadyTimeout, code)
		case <-time.After(readyPoll):
		}
		if attempt%10 == 1 {
			lg.output(false, out)
			lg.info("not ready yet (attempt %d, exit code %d)", attempt, code)
		}
	}
}
