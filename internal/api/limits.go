package api

import (
	"fmt"
	"net/http"
	"time"
)

// What one API connection and request may take. Responses of the API are
// never streamed, so a write timeout applies; the template file upload
// (a body of up to a gigabyte) gets UploadTimeout instead, and a volume
// file read or written through the content API ContentTimeout.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = time.Minute
	DefaultWriteTimeout      = 2 * time.Minute
	DefaultIdleTimeout       = 2 * time.Minute
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultUploadTimeout     = 30 * time.Minute
	DefaultContentTimeout    = time.Hour
)

// Timeouts are an http.Server's limits; zero fields take the defaults.
type Timeouts struct {
	ReadHeader, Read, Write, Idle time.Duration
	MaxHeaderBytes                int
}

// NewHTTPServer returns the API's server: h (from New) with timeouts.
func NewHTTPServer(h http.Handler, t Timeouts) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: orDefault(t.ReadHeader, DefaultReadHeaderTimeout),
		ReadTimeout:       orDefault(t.Read, DefaultReadTimeout),
		WriteTimeout:      orDefault(t.Write, DefaultWriteTimeout),
		IdleTimeout:       orDefault(t.Idle, DefaultIdleTimeout),
		MaxHeaderBytes:    orDefault(t.MaxHeaderBytes, DefaultMaxHeaderBytes),
	}
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// extendDeadlines gives a long request (the upload) its own deadlines in
// place of the server's read and write timeouts.
func extendDeadlines(w http.ResponseWriter, d time.Duration) {
	rc := http.NewResponseController(w)
	deadline := time.Now().Add(d)
	// Errors mean the writer cannot take deadlines (a test recorder):
	// the server's timeouts stay.
	_ = rc.SetReadDeadline(deadline)
	_ = rc.SetWriteDeadline(deadline)
}

// diskFull answers 507 and returns true when the data dir's file system
// has less free space than the reserve.
func (s *Server) diskFull(w http.ResponseWriter, r *http.Request) bool {
	return s.fullDisk(w, r, s.cfg.FreeDiskMB)
}

// volumeDiskFull is diskFull for the volume root's file system.
func (s *Server) volumeDiskFull(w http.ResponseWriter, r *http.Request) bool {
	return s.fullDisk(w, r, s.volumeFreeMB())
}

// volumeFreeMB reads the volume root's free space.
func (s *Server) volumeFreeMB() func() (int64, error) {
	if s.cfg.VolumeFreeDiskMB != nil {
		return s.cfg.VolumeFreeDiskMB
	}
	return s.cfg.FreeDiskMB
}

// fullDisk answers 507 and returns true when freeMB says less than the
// reserve.
func (s *Server) fullDisk(w http.ResponseWriter, r *http.Request, freeMB func() (int64, error)) bool {
	if s.cfg.DiskReserveMB <= 0 || freeMB == nil {
		return false
	}
	free, err := freeMB()
	if err != nil {
		s.internal(w, r, fmt.Errorf("reading the data dir's free space: %w", err))
		return true
	}
	if free >= s.cfg.DiskReserveMB {
		return false
	}
	writeError(w, http.StatusInsufficientStorage, fmt.Sprintf(
		"the node's data disk has %d MB free, less than the %d MB it keeps in reserve (--disk-reserve-mb): nothing new is made until space is freed; retry later",
		free, s.cfg.DiskReserveMB))
	return true
}

// checkResources applies the seed's bounds (cpuCount ≥ 1, memoryMB ≥
// 128) and the node's: no template may ask more than the whole node has.
func (s *Server) checkResources(cpu, mem *int32) error {
	if cpu != nil && *cpu < 1 {
		return fmt.Errorf("cpuCount must be at least 1")
	}
	if mem != nil && *mem < 128 {
		return fmt.Errorf("memoryMB must be at least 128")
	}
	if cpu != nil && s.cfg.NodeCPUs > 0 && int(*cpu) > s.cfg.NodeCPUs {
		return fmt.Errorf("cpuCount %d is more than this node has (%d CPUs)", *cpu, s.cfg.NodeCPUs)
	}
	if mem != nil && s.cfg.NodeMemoryMB > 0 && int(*mem) > s.cfg.NodeMemoryMB {
		return fmt.Errorf("memoryMB %d is more than this node has (%d MB)", *mem, s.cfg.NodeMemoryMB)
	}
	return nil
}
