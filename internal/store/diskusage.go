package store

import (
	"context"
	"time"
)

// Kinds of DiskUse: what of a team's takes a node's disk besides its
// volumes.
const (
	DiskPaused   = "paused"   // a paused sandbox's files (ObjectID: the sandbox)
	DiskTemplate = "template" // a built template's image (ObjectID: the template)
	DiskSnapshot = "snapshot" // a snapshot template's image (ObjectID: the template)
)

// DiskUse is what one thing of a team takes of a node's disk, as the
// node measured it.
type DiskUse struct {
	Kind      string
	ObjectID  string
	TeamID    string
	Node      string
	Bytes     int64
	UpdatedAt time.Time
}

// TeamDisk is a team's disk usage by kind, in bytes.
type TeamDisk struct {
	// Volumes is the size of the team's volumes' file systems (their
	// quota, all of it held on the node's disk).
	Volumes   int64
	Paused    int64
	Templates int64
	Snapshots int64
}

// Total is the team's whole usage.
func (d TeamDisk) Total() int64 { return d.Volumes + d.Paused + d.Templates + d.Snapshots }

// DiskUsageStore accounts teams' disk usage.
type DiskUsageStore interface {
	// SetDiskUse records (or replaces) what one thing takes.
	SetDiskUse(ctx context.Context, u DiskUse) error
	// TeamDiskUsage sums a team's usage: its volumes, its paused
	// sandboxes (only while paused) and its templates (only while they
	// exist). An empty team ID is an error: it never means every team.
	TeamDiskUsage(ctx context.Context, teamID string) (TeamDisk, error)
}
