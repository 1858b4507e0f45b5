package node

import (
	"context"

	"github.com/warren-sandbox/warren/internal/image"
)

// ImageRootfs mounts sandboxes' root filesystems from an image store.
func ImageRootfs(s *image.Store) RootfsMounter { return imageRootfs{s} }

type imageRootfs struct{ s *image.Store }

func (m imageRootfs) Cleanup(keep func(string) bool) error { return m.s.Cleanup(keep) }

func (m imageRootfs) Mount(ctx context.Context, id string, layers []string, diskSizeMB int) (Rootfs, error) {
	r, err := m.s.Mount(ctx, id, layers, diskSizeMB)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return mounted{r, m.s}, nil
}

func (m imageRootfs) Adopt(id string) (Rootfs, bool) {
	r, ok := m.s.Adopt(id)
	if !ok {
		return nil, false
	}
	return r, true
}

// mounted is a root filesystem this node mounted, which can be committed.
type mounted struct {
	*image.Rootfs
	s *image.Store
}

func (m mounted) Commit(layerID string) error { return m.Rootfs.Commit(m.s, layerID) }
