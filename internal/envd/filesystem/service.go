// Package filesystem implements E2B's filesystem.Filesystem Connect service.
package filesystem

import (
	"github.com/warren-sandbox/warren/internal/envd/settings"
	"github.com/warren-sandbox/warren/proto/envd/filesystem/filesystemconnect"
)

// Service implements filesystemconnect.FilesystemHandler.
type Service struct {
	filesystemconnect.UnimplementedFilesystemHandler
	settings *settings.Settings
}

// NewService returns the filesystem service.
func NewService(s *settings.Settings) *Service { return &Service{settings: s} }

// Close stops every watcher.
func (s *Service) Close() {}
