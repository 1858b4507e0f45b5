package api

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/warren-sandbox/warren/internal/store"
)

// overDiskQuota answers 507 with the figures and returns true when the
// request's team, with need more bytes (0 when the size is not known
// before: a checkpoint, a build), would be over its disk quota
// (Config.TeamDiskQuotaMB). The quota is soft: usage is what the store
// accounts, measured when a thing is made, so what is being made while
// this is asked (a build running, a pause saving) may take the team past
// the quota until its next request is refused.
func (s *Server) overDiskQuota(w http.ResponseWriter, r *http.Request, need int64, what string) bool {
	if s.cfg.TeamDiskQuotaMB <= 0 {
		return false
	}
	team := teamOf(r)
	if team == "" { // fail closed: never "every team", never none
		s.internal(w, r, fmt.Errorf("disk quota: a request without a team"))
		return true
	}
	u, err := s.cfg.Store.TeamDiskUsage(r.Context(), team)
	if err != nil {
		s.internal(w, r, fmt.Errorf("reading the team's disk usage: %w", err))
		return true
	}
	limit := s.cfg.TeamDiskQuotaMB << 20
	used := u.Total()
	if used+max(need, 1) <= limit {
		return false
	}
	writeError(w, http.StatusInsufficientStorage, quotaMessage(u, limit, need, what))
	return true
}

// quotaMessage says what is over the quota, with the figures.
func quotaMessage(u store.TeamDisk, limit, need int64, what string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "team disk quota exceeded: %s used of %s", gb(u.Total()), gb(limit))
	if need > 0 {
		fmt.Fprintf(&b, ", and %s needs %s more", what, gb(need))
	}
	fmt.Fprintf(&b, " (volumes %s, paused sandboxes %s, templates %s, snapshots %s; --team-disk-quota-mb): delete some to make room",
		gb(u.Volumes), gb(u.Paused), gb(u.Templates), gb(u.Snapshots))
	return b.String()
}

// gb formats bytes as GB (GiB), one decimal, none when whole.
func gb(n int64) string {
	s := strconv.FormatFloat(float64(n)/(1<<30), 'f', 1, 64)
	return strings.TrimSuffix(s, ".0") + " GB"
}
