package blobstore

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/store"
)

// BenchmarkPauseResumeAcrossNodes measures, for a sandbox holding
// 50 MiB of memory (a tmpfs file in the sandbox), 10 rounds each of:
//
//	local:      pause and resume on a node without the blob store (wbsc)
//	store:      pause on wbsa with the blob store (the upload included),
//	            then resume on wbsb from it (wbsa's record points at a
//	            node that is gone, as when wbsa is lost)
//
// and reports the medians and the slowest (p99 of 10) in ms. Run with
// -benchtime=1x:
//
//	flock /tmp/warren-test.lock go test -run '^$' -bench PauseResumeAcrossNodes -benchtime=1x ./test/security/blobstore/
func BenchmarkPauseResumeAcrossNodes(b *testing.B) {
	c := startCluster(b, nil, true)
	ctx := context.Background()
	const rounds = 10
	var localPause, localResume, storePause, storeResume []float64
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	timed := func(method, path string, body any, want ...int) time.Duration {
		start := time.Now()
		r, err := c.call(ctx, c.apiKey, method, path, body)
		took := time.Since(start)
		if err != nil || !slices.Contains(want, r.status) {
			b.Fatalf("%s %s: %v %v", method, path, r, err)
		}
		return took
	}
	fill := func(sb sandbox) {
		if r, err := c.exec(ctx, sb, `head -c 50M /dev/urandom > /dev/shm/resident && echo ok`); err != nil || r.exit != 0 {
			b.Fatalf("filling the sandbox: %v %+v", err, r)
		}
	}
	for range rounds {
		sb := c.createOn(ctx, b, localNode.name)
		fill(sb)
		localPause = append(localPause, ms(timed("POST", "/sandboxes/"+sb.ID+"/pause", nil, http.StatusNoContent)))
		localResume = append(localResume, ms(timed("POST", "/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 60}, http.StatusCreated)))
		timed("DELETE", "/sandboxes/"+sb.ID, nil, http.StatusNoContent)

		sb = c.createOn(ctx, b, nodeSpecs[0].name)
		fill(sb)
		storePause = append(storePause, ms(timed("POST", "/sandboxes/"+sb.ID+"/pause", nil, http.StatusNoContent)))
		if _, err := c.st.UpdateSandbox(ctx, sb.ID, func(s *store.Sandbox) error { s.Node = "gone"; return nil }); err != nil {
			b.Fatal(err)
		}
		// Only wbsb may take it (wbsa keeps a copy it must not use).
		for _, n := range []string{nodeSpecs[0].name, localNode.name} {
			if err := c.setNode(ctx, n, store.NodeCordoned); err != nil {
				b.Fatal(err)
			}
		}
		time.Sleep(time.Second)
		storeResume = append(storeResume, ms(timed("POST", "/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 60}, http.StatusCreated)))
		for _, n := range []string{nodeSpecs[0].name, localNode.name} {
			if err := c.setNode(ctx, n, store.NodeReady); err != nil {
				b.Fatal(err)
			}
		}
		if rec, err := c.st.GetSandbox(ctx, sb.ID); err != nil || rec.Node != nodeSpecs[1].name {
			b.Fatalf("resumed on %q, not %s: %v", rec.Node, nodeSpecs[1].name, err)
		}
		if r, err := c.exec(ctx, sb, `test $(stat -c %s /dev/shm/resident) = 52428800 && echo ok`); err != nil || r.exit != 0 {
			b.Fatalf("the resumed sandbox lost its memory: %v %+v", err, r)
		}
		timed("DELETE", "/sandboxes/"+sb.ID, nil, http.StatusNoContent)
	}
	for _, s := range []struct {
		name string
		v    []float64
	}{{"local-pause", localPause}, {"local-resume", localResume}, {"store-pause", storePause}, {"store-resume-other-node", storeResume}} {
		slices.Sort(s.v)
		b.ReportMetric(s.v[len(s.v)/2], s.name+"-p50-ms")
		b.ReportMetric(s.v[len(s.v)-1], s.name+"-max-ms")
		b.Logf("%s: p50 %.0f ms, max %.0f ms, all %v", s.name, s.v[len(s.v)/2], s.v[len(s.v)-1], s.v)
	}
}
