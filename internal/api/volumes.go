package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/warren-sandbox/warren/internal/api/gen"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/volume"
)

// The volume endpoints: /volumes (X-API-Key, the team's volumes) and the
// volume content API /volumecontent/{volumeID}/dir|path|file, which the
// SDK reaches at E2B_VOLUME_API_URL (this API's address) with the
// volume's own token as Authorization: Bearer. What they do is
// internal/volume's.

const volumeContentPrefix = "/volumecontent/"

// volumeContentID is the volume a content request names, if it is one.
func volumeContentID(r *http.Request) (string, bool) {
	rest, ok := strings.CutPrefix(r.URL.Path, volumeContentPrefix)
	if !ok {
		return "", false
	}
	id, _, _ := strings.Cut(rest, "/")
	return id, true
}

// isVolumeFileWrite tells the content API's file upload, whose body is
// the file (streamed, not capped at maxBody).
func isVolumeFileWrite(r *http.Request) bool {
	_, ok := volumeContentID(r)
	return ok && r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/file")
}

type volumeKey struct{}

// authenticateVolume admits a content request whose bearer token is the
// named volume's, under its team's rate limit. A wrong token, or one for
// another or no volume, is a failure (authFailed).
func (s *Server) authenticateVolume(next http.Handler, w http.ResponseWriter, r *http.Request, id, client string) {
	if s.cfg.Volumes == nil {
		writeError(w, http.StatusNotFound, "this server keeps no volumes")
		return
	}
	token := ""
	if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		token = strings.TrimSpace(h[7:])
	}
	v, err := s.cfg.Volumes.Authenticate(r.Context(), id, token)
	if errors.Is(err, volume.ErrUnauthorized) {
		s.authFailed(w, client, "missing or invalid volume token: send the volume's token (from POST or GET /volumes) as Authorization: Bearer")
		return
	}
	if err != nil {
		s.internal(w, r, err)
		return
	}
	if s.teams != nil {
		if ok, wait := s.teams.Allow(v.TeamID); !ok {
			tooMany(w, wait, fmt.Sprintf("the team's rate limit (%g requests/s) is exceeded; retry later", s.cfg.RateLimit))
			return
		}
	}
	ctx, err := withTeam(context.WithValue(r.Context(), volumeKey{}, v), v.TeamID)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	next.ServeHTTP(w, r.WithContext(ctx))
}

// failVolume maps the volume manager's errors to statuses.
func (s *Server) failVolume(w http.ResponseWriter, r *http.Request, err error) {
	var inUse *store.VolumeInUseError
	switch {
	case errors.As(err, &inUse):
		writeError(w, http.StatusConflict, fmt.Sprintf("the volume is mounted by sandboxes that are running, paused or starting: %s; kill them first", strings.Join(inUse.SandboxIDs, ", ")))
	case errors.Is(err, volume.ErrNotFound), errors.Is(err, volume.ErrPathNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, volume.ErrInvalid):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, volume.ErrConflict):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, volume.ErrTeamLimit):
		writeError(w, http.StatusTooManyRequests, err.Error())
	case errors.Is(err, volume.ErrNoSpace):
		writeError(w, http.StatusInsufficientStorage, err.Error())
	case r.Context().Err() != nil:
		writeError(w, 499, "client closed request")
	default:
		s.internal(w, r, err)
	}
}

// volumes is s.cfg.Volumes, or false after a 404 when there are none.
func (s *Server) volumes(w http.ResponseWriter) (Volumes, bool) {
	if s.cfg.Volumes == nil {
		writeError(w, http.StatusNotFound, "this server keeps no volumes")
		return nil, false
	}
	return s.cfg.Volumes, true
}

func volumeAndToken(v store.Volume) gen.VolumeAndToken {
	return gen.VolumeAndToken{VolumeID: v.ID, Name: v.Name, Token: v.Token}
}

func (s *Server) CreateVolume(w http.ResponseWriter, r *http.Request) {
	vols, ok := s.volumes(w)
	if !ok {
		return
	}
	var body gen.NewVolume
	if !readJSON(w, r, &body, false) {
		return
	}
	if s.volumeDiskFull(w, r) || s.overDiskQuota(w, r, s.cfg.VolumeQuotaMB<<20, "the volume") {
		return
	}
	v, err := vols.Create(r.Context(), teamOf(r), body.Name)
	if err != nil {
		s.failVolume(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, volumeAndToken(v))
}

func (s *Server) ListVolumes(w http.ResponseWriter, r *http.Request) {
	vols, ok := s.volumes(w)
	if !ok {
		return
	}
	list, err := vols.List(r.Context(), teamOf(r))
	if err != nil {
		s.failVolume(w, r, err)
		return
	}
	out := make([]gen.Volume, 0, len(list))
	for _, v := range list {
		out = append(out, gen.Volume{VolumeID: v.ID, Name: v.Name})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) GetVolume(w http.ResponseWriter, r *http.Request, id gen.VolumeID) {
	vols, ok := s.volumes(w)
	if !ok {
		return
	}
	v, err := vols.Get(r.Context(), teamOf(r), id)
	if err != nil {
		s.failVolume(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, volumeAndToken(v))
}

func (s *Server) DeleteVolume(w http.ResponseWriter, r *http.Request, id gen.VolumeID) {
	vols, ok := s.volumes(w)
	if !ok {
		return
	}
	if err := vols.Delete(r.Context(), teamOf(r), id); err != nil {
		s.failVolume(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// withTree runs fn on the files of the volume the request authenticated
// for (authenticateVolume), which must be the one its path names.
func (s *Server) withTree(w http.ResponseWriter, r *http.Request, id string, fn func(*volume.Tree)) {
	v, ok := r.Context().Value(volumeKey{}).(store.Volume)
	if !ok || v.ID != id {
		writeError(w, http.StatusUnauthorized, "missing or invalid volume token")
		return
	}
	tree, err := s.cfg.Volumes.Tree(v)
	if err != nil {
		s.failVolume(w, r, err)
		return
	}
	defer tree.Close()
	fn(tree)
}

func entryOf(e volume.Entry) gen.VolumeEntryStat {
	return gen.VolumeEntryStat{
		Name: e.Name, Path: e.Path, Type: gen.VolumeEntryStatType(e.Type), Size: e.Size, Mode: e.Mode,
		Uid: e.UID, Gid: e.GID, Atime: e.Atime, Mtime: e.Mtime, Ctime: e.Ctime, Target: e.Target,
	}
}

func (s *Server) ListVolumeDir(w http.ResponseWriter, r *http.Request, id gen.VolumeID, params gen.ListVolumeDirParams) {
	s.withTree(w, r, id, func(t *volume.Tree) {
		depth := 1
		if params.Depth != nil {
			depth = int(min(*params.Depth, volume.MaxDepth+1))
		}
		list, err := t.List(params.Path, depth)
		if err != nil {
			s.failVolume(w, r, err)
			return
		}
		out := make([]gen.VolumeEntryStat, 0, len(list))
		for _, e := range list {
			out = append(out, entryOf(e))
		}
		writeJSON(w, http.StatusOK, out)
	})
}

func (s *Server) MakeVolumeDir(w http.ResponseWriter, r *http.Request, id gen.VolumeID, params gen.MakeVolumeDirParams) {
	s.withTree(w, r, id, func(t *volume.Tree) {
		e, err := t.MakeDir(params.Path, volume.Owner{UID: params.Uid, GID: params.Gid, Mode: params.Mode}, deref(params.Force))
		if err != nil {
			s.failVolume(w, r, err)
			return
		}
		writeJSON(w, http.StatusCreated, entryOf(e))
	})
}

func (s *Server) StatVolumePath(w http.ResponseWriter, r *http.Request, id gen.VolumeID, params gen.StatVolumePathParams) {
	s.withTree(w, r, id, func(t *volume.Tree) {
		e, err := t.Stat(params.Path)
		if err != nil {
			s.failVolume(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, entryOf(e))
	})
}

func (s *Server) UpdateVolumePath(w http.ResponseWriter, r *http.Request, id gen.VolumeID, params gen.UpdateVolumePathParams) {
	var body gen.VolumeMetadataUpdate
	if !readJSON(w, r, &body, false) {
		return
	}
	s.withTree(w, r, id, func(t *volume.Tree) {
		e, err := t.Update(params.Path, volume.Owner{UID: body.Uid, GID: body.Gid, Mode: body.Mode})
		if err != nil {
			s.failVolume(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, entryOf(e))
	})
}

func (s *Server) RemoveVolumePath(w http.ResponseWriter, r *http.Request, id gen.VolumeID, params gen.RemoveVolumePathParams) {
	s.withTree(w, r, id, func(t *volume.Tree) {
		if err := t.Remove(params.Path); err != nil {
			s.failVolume(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

func (s *Server) ReadVolumeFile(w http.ResponseWriter, r *http.Request, id gen.VolumeID, params gen.ReadVolumeFileParams) {
	s.withTree(w, r, id, func(t *volume.Tree) {
		f, e, err := t.Open(params.Path)
		if err != nil {
			s.failVolume(w, r, err)
			return
		}
		defer f.Close()
		extendDeadlines(w, s.cfg.ContentTimeout)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(e.Size, 10))
		w.WriteHeader(http.StatusOK)
		// Streamed (sendfile where the connection allows); a file that
		// changes meanwhile is cut or padded by nobody: the client sees
		// a short body and fails.
		if _, err := io.CopyN(w, f, e.Size); err != nil && r.Context().Err() == nil {
			s.log.WarnContext(r.Context(), "reading a volume file", "volume", id, "err", err)
		}
	})
}

func (s *Server) WriteVolumeFile(w http.ResponseWriter, r *http.Request, id gen.VolumeID, params gen.WriteVolumeFileParams) {
	if s.volumeDiskFull(w, r) {
		return
	}
	s.withTree(w, r, id, func(t *volume.Tree) {
		extendDeadlines(w, s.cfg.ContentTimeout)
		e, err := t.Write(params.Path, r.Body, volume.Owner{UID: params.Uid, GID: params.Gid, Mode: params.Mode}, deref(params.Force), s.reserveGuard)
		if err != nil {
			s.failVolume(w, r, err)
			return
		}
		writeJSON(w, http.StatusCreated, entryOf(e))
	})
}

// reserveGuard stops a volume file write once the node's disk falls
// below its reserve (a volume without a quota of its own could fill it).
func (s *Server) reserveGuard(int64) error {
	freeMB := s.volumeFreeMB()
	if s.cfg.DiskReserveMB <= 0 || freeMB == nil {
		return nil
	}
	free, err := freeMB()
	if err != nil {
		return err
	}
	if free < s.cfg.DiskReserveMB {
		return fmt.Errorf("%w: the volume root's disk has %d MB free, less than the %d MB it keeps in reserve (--disk-reserve-mb)", volume.ErrNoSpace, free, s.cfg.DiskReserveMB)
	}
	return nil
}
