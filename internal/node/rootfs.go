package node

import (
	"context"
	"errors"

	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/rootfs"
)

// LocalRootfs mounts sandboxes' root filesystems with roots over the
// layers of an image store, and commits them into that store.
func LocalRootfs(roots *rootfs.Manager, layers *image.Store) RootfsMounter {
	return localRootfs{roots, layers}
}

type localRootfs struct {
	roots  *rootfs.Manager
	layers *image.Store
}

// Cleanup removes the root filesystems of sandboxes keep rejects, and
// the layers a crashed run left half-written.
func (m localRootfs) Cleanup(keep func(string) bool) error {
	return errors.Join(m.roots.Cleanup(keep), m.layers.Cleanup())
}

func (m localRootfs) Mount(ctx context.Context, id string, layers []string, diskSizeMB int) (Rootfs, error) {
	r, err := m.roots.Mount(ctx, id, layers, diskSizeMB)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return mounted{r, m.layers}, nil
}

func (m localRootfs) Remount(ctx context.Context, id string, layers []string) (Rootfs, error) {
	r, err := m.roots.Remount(ctx, id, layers)
	if err != nil {
		return nil, err
	}
	return mounted{r, m.layers}, nil
}

func (m localRootfs) MountCopy(ctx context.Context, id string, layers []string, diskImage string) (Rootfs, error) {
	r, err := m.roots.MountCopy(ctx, id, layers, diskImage)
	if err != nil {
		return nil, err
	}
	return mounted{r, m.layers}, nil
}

func (m localRootfs) Remove(id string) error { return m.roots.Remove(id) }

func (m localRootfs) Kept(id string) (Rootfs, bool) {
	r, ok := m.roots.Kept(id)
	if !ok {
		return nil, false
	}
	return mounted{r, m.layers}, true
}

func (m localRootfs) Adopt(id string) (Rootfs, bool) {
	r, ok := m.roots.Adopt(id)
	if !ok {
		return nil, false
	}
	return r, true
}

// mounted is a root filesystem this node mounted, which can be committed.
type mounted struct {
	*rootfs.Root
	layers *image.Store
}

func (m mounted) Commit(layerID string) error { return m.Root.Commit(m.layers, layerID) }

func (m localRootfs) HomeDir(id string) (string, error) { return m.roots.HomeDir(id) }
