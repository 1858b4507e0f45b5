package api

import (
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
)

// --max-sandbox-timeout moves the bound of every timeout a client asks
// for; without it the bound is E2B's 24 h.
func TestMaxTimeoutIsTheOperators(t *testing.T) {
	for _, c := range []struct {
		max       time.Duration
		ok, large string
	}{
		{0, "86400", "86401"},
		{7 * 24 * time.Hour, "604800", "604801"},
		{time.Hour, "3600", "3601"},
	} {
		hs := newHarness(t, Config{MaxTimeout: c.max})
		var got []time.Duration
		hs.sandboxes.create = func(req sandbox.CreateRequest) (store.Sandbox, error) {
			got = append(got, req.Timeout)
			return store.Sandbox{ID: "sbx1", TemplateID: req.TemplateID}, nil
		}
		if w := hs.do("POST", "/v2/sandboxes", keyTeam1, `{"templateID":"base","timeout":`+c.ok+`}`); w.Code != 201 {
			t.Errorf("max %s, timeout %s: %d %s", c.max, c.ok, w.Code, w.Body)
		}
		if w := hs.do("POST", "/v2/sandboxes", keyTeam1, `{"templateID":"base","timeout":`+c.large+`}`); w.Code != 400 {
			t.Errorf("max %s, timeout %s: %d %s", c.max, c.large, w.Code, w.Body)
		}
		if len(got) != 1 {
			t.Errorf("max %s: the manager was asked %v", c.max, got)
		}
	}
}
