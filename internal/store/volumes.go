package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Volume is a team volume's record. Its data lives under the node's
// volume root (internal/volume), named by ID.
type Volume struct {
	ID     string
	TeamID string
	// Name is unique within the team; sandboxes mount a volume by name.
	Name string
	// Token opens the volume content API, for this volume only.
	Token string
	// QuotaMB is the size of the volume's own file system; 0 when the
	// volume is a plain directory without a limit of its own.
	QuotaMB   int
	CreatedAt time.Time
}

// VolumeMount is a volume mounted into a sandbox: its ID and name when
// the sandbox was created, and where the sandbox sees it.
type VolumeMount struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
	Path     string `json:"path"`
}

// ErrInUse is returned (wrapped, as a *VolumeInUseError) when a volume
// that sandboxes mount is deleted.
var ErrInUse = errors.New("in use")

// VolumeInUseError names the sandboxes that still mount a volume.
type VolumeInUseError struct {
	VolumeID   string
	SandboxIDs []string
}

func (e *VolumeInUseError) Error() string {
	return fmt.Sprintf("store: volume %s is mounted by sandboxes %s", e.VolumeID, strings.Join(e.SandboxIDs, ", "))
}

func (e *VolumeInUseError) Is(target error) bool { return target == ErrInUse }

// VolumeStore keeps team volumes. Every lookup but VolumeByID is scoped
// by team, and an empty team ID finds nothing.
type VolumeStore interface {
	// CreateVolume records a volume; ErrConflict if its ID, or its name
	// in its team, is taken.
	CreateVolume(ctx context.Context, v Volume) error
	// GetVolume returns a team's volume by ID.
	GetVolume(ctx context.Context, teamID, id string) (Volume, error)
	// VolumeByName returns a team's volume by name.
	VolumeByName(ctx context.Context, teamID, name string) (Volume, error)
	// VolumeByID returns any team's volume: only for the volume content
	// API, whose caller then proves it holds the volume's token.
	VolumeByID(ctx context.Context, id string) (Volume, error)
	// ListVolumes lists a team's volumes, oldest first.
	ListVolumes(ctx context.Context, teamID string) ([]Volume, error)
	// DeleteVolume removes a team's volume, unless a sandbox that is not
	// killed (creating, running or paused) mounts it: then it fails with
	// a *VolumeInUseError. stage, if not nil, runs after that check and
	// before the record goes, while no sandbox can start mounting the
	// volume; its error aborts the deletion.
	DeleteVolume(ctx context.Context, teamID, id string, stage func() error) error
}
