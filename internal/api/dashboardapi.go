package api

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/api/gen"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
)

// The calls E2B's own dashboard makes beside the SDK's, which the
// generated router cannot hold beside its routes (GET /sandboxes/metrics
// beside GET /sandboxes/{sandboxID}): GET /sandboxes/metrics (the latest
// sample of each of up to maxMetricsIDs sandboxes) and GET
// /templates/{id}/builds/{buildID}/logs (structured, by time cursor).
const (
	maxMetricsIDs     = 100
	maxBuildLogsLimit = 100
	// maxBuildLogPages bounds the pages of a build's log read to answer
	// one cursor call (each of maxBuildLogsLimit entries).
	maxBuildLogPages = 200
)

// routeDashboardAPI serves E2B's dashboard calls before the generated
// router, and E2B's dashboard-api service below DashboardAPIPrefix
// (dashboardservice.go).
func (s *Server) routeDashboardAPI(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rest, ok := strings.CutPrefix(r.URL.Path, DashboardAPIPrefix+"/"); ok {
			s.dashboardService(w, r, "/"+rest)
			return
		}
		if r.Method == http.MethodGet {
			if r.URL.Path == "/sandboxes/metrics" {
				s.sandboxesMetrics(w, r)
				return
			}
			if rest, ok := strings.CutPrefix(r.URL.Path, "/templates/"); ok {
				parts := strings.Split(rest, "/")
				if len(parts) == 4 && parts[1] == "builds" && parts[3] == "logs" && parts[0] != "" && parts[2] != "" {
					s.buildLogs(w, r, parts[0], parts[2])
					return
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// sandboxesMetrics answers E2B's SandboxesWithMetrics: the latest sample
// of each named sandbox of the team that has one; others (unknown, another
// team's, not sampled yet) are left out, as E2B does.
func (s *Server) sandboxesMetrics(w http.ResponseWriter, r *http.Request) {
	raw := r.URL.Query()["sandbox_ids"]
	var ids []string
	for _, v := range raw {
		for _, id := range strings.Split(v, ",") {
			if id = strings.TrimSpace(id); id != "" && !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	if len(ids) == 0 {
		writeError(w, http.StatusBadRequest, "sandbox_ids is required: a comma-separated list of sandbox IDs")
		return
	}
	if len(ids) > maxMetricsIDs {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("sandbox_ids names %d sandboxes; at most %d", len(ids), maxMetricsIDs))
		return
	}
	out := map[string]gen.SandboxMetric{}
	since := time.Now().Add(-time.Minute) // samples come every few seconds
	for _, id := range ids {
		ms, err := s.cfg.Sandboxes.Metrics(r.Context(), teamIDOf(r), id, since, time.Time{})
		if errors.Is(err, sandbox.ErrNotFound) {
			continue
		}
		if err != nil {
			s.fail(w, r, err)
			return
		}
		if len(ms) == 0 {
			continue
		}
		m := ms[len(ms)-1]
		out[id] = gen.SandboxMetric{
			Timestamp: m.Time.UTC(), TimestampUnix: m.Time.Unix(), CpuCount: int32(m.CPUCount), CpuUsedPct: float32(m.CPUUsedPct),
			MemUsed: m.MemUsed, MemTotal: m.MemTotal, MemCache: m.MemCache, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal,
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
}

// buildLogs answers E2B's TemplateBuildLogsResponse: entries at or after
// cursor (Unix ms) oldest first (direction forward, the default), or at
// or before it newest first (backward; no cursor: from now), at most
// limit (default and most 100), of level or more severe.
func (s *Server) buildLogs(w http.ResponseWriter, r *http.Request, templateID, buildID string) {
	b, ok := s.templates(w)
	if !ok {
		return
	}
	q := r.URL.Query()
	limit := maxBuildLogsLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxBuildLogsLimit {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit must be between 0 and %d", maxBuildLogsLimit))
			return
		}
		limit = n
	}
	backward := false
	switch q.Get("direction") {
	case "", "forward":
	case "backward":
		backward = true
	default:
		writeError(w, http.StatusBadRequest, "direction must be forward or backward")
		return
	}
	level := strings.ToLower(q.Get("level"))
	switch level {
	case "", "debug", "info", "warn", "error":
	default:
		writeError(w, http.StatusBadRequest, "level must be debug, info, warn or error")
		return
	}
	var cursor time.Time
	hasCursor := false
	if v := q.Get("cursor"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 0 {
			writeError(w, http.StatusBadRequest, "cursor must be a non-negative integer (Unix milliseconds)")
			return
		}
		cursor, hasCursor = time.UnixMilli(ms), true
	}
	var all []store.BuildLogEntry
	for page := 0; page < maxBuildLogPages; page++ {
		st, err := b.Status(r.Context(), teamOf(r), templateID, buildID, len(all), maxBuildLogsLimit, level)
		if err != nil {
			s.failTemplate(w, r, err)
			return
		}
		all = append(all, st.Logs...)
		if len(st.Logs) < maxBuildLogsLimit {
			break
		}
	}
	var picked []store.BuildLogEntry
	if backward {
		for i := len(all) - 1; i >= 0 && len(picked) < limit; i-- {
			if !hasCursor || !all[i].Time.After(cursor) {
				picked = append(picked, all[i])
			}
		}
	} else {
		for _, e := range all {
			if len(picked) == limit {
				break
			}
			if !hasCursor || !e.Time.Before(cursor) {
				picked = append(picked, e)
			}
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"logs": logEntries(picked)})
}
