package blobstore

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/warren-sandbox/warren/internal/store"
)

// BenchmarkPauseResumeAcrossNodes measures, for a sandbox holding 50 MiB
// and one holding 500 MiB of memory (a tmpfs file in the sandbox; the
// 500 MiB one from a template of 1280 MB built first), 10 rounds each of:
//
//	local:      pause and resume on a node without the blob store (wbsc)
//	store:      pause on wbsa with the blob store (the upload included),
//	            then resume on wbsb from it (wbsa's record points at a
//	            node that is gone, as when wbsa is lost)
//	plain:      the paused sandbox's blob copied by a plain S3 client
//	            (minio-go FGetObject, then FPutObject under another key)
//	            from and to the same SeaweedFS: the store's own speed
//
// with the pause's pack and upload and the resume's download and unpack
// read from the nodes' logs, and reports the medians and the slowest
// (max of 10) in ms, and the throughputs' medians in MB/s. Run with
// -benchtime=1x:
//
//	flock /tmp/warren-test.lock go test -run '^$' -bench PauseResumeAcrossNodes -benchtime=1x -timeout 40m ./test/security/blobstore/
//
// BENCH_BLOB_SIZES (default "50,500") and BENCH_BLOB_ROUNDS (10) narrow it.
func BenchmarkPauseResumeAcrossNodes(b *testing.B) {
	c := startCluster(b, nil, true)
	ctx := context.Background()
	rounds := 10
	if v := os.Getenv("BENCH_BLOB_ROUNDS"); v != "" {
		fmt.Sscan(v, &rounds)
	}
	sizes := []int{50, 500}
	if v := os.Getenv("BENCH_BLOB_SIZES"); v != "" {
		sizes = nil
		for _, s := range strings.Split(v, ",") {
			var n int
			fmt.Sscan(s, &n)
			sizes = append(sizes, n)
		}
	}
	mc := c.s3Client(b)
	for _, mib := range sizes {
		tmpl := "base"
		if mib > 200 {
			tmpl = c.buildTemplate(ctx, b, fmt.Sprintf("bench-%dm", mib), mib+780)
		}
		c.benchSize(ctx, b, mc, tmpl, mib, rounds)
	}
}

// benchSize is the benchmark's rounds for mib MiB resident.
func (c *cluster) benchSize(ctx context.Context, b *testing.B, mc *minio.Client, tmpl string, mib, rounds int) {
	series := map[string][]float64{}
	var order []string
	add := func(name string, v float64) {
		if _, ok := series[name]; !ok {
			order = append(order, name)
		}
		series[name] = append(series[name], v)
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	mbps := func(n int64, d time.Duration) float64 { return float64(n) / 1e6 / d.Seconds() }
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
		if r, err := c.exec(ctx, sb, fmt.Sprintf(`head -c %dM /dev/urandom > /dev/shm/resident && echo ok`, mib)); err != nil || r.exit != 0 {
			b.Fatalf("filling the sandbox: %v %+v", err, r)
		}
	}
	scratch := filepath.Join(b.TempDir(), "blob")
	a, bn := c.nodes[0], c.nodes[1]
	for range rounds {
		sb := c.createFromOn(ctx, b, localNode.name, tmpl)
		fill(sb)
		add("local-pause", ms(timed("POST", "/sandboxes/"+sb.ID+"/pause", nil, http.StatusNoContent)))
		add("local-resume", ms(timed("POST", "/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 60}, http.StatusCreated)))
		timed("DELETE", "/sandboxes/"+sb.ID, nil, http.StatusNoContent)

		sb = c.createFromOn(ctx, b, a.name, tmpl)
		fill(sb)
		add("store-pause", ms(timed("POST", "/sandboxes/"+sb.ID+"/pause", nil, http.StatusNoContent)))
		rec, err := c.st.GetSandbox(ctx, sb.ID)
		if err != nil || rec.PausedBlob == "" {
			b.Fatalf("paused without a blob: %+v %v", rec, err)
		}
		if pack, upload, n, ok := logSteps(a.logPath, "paused sandbox stored in the blob store", sb.ID, "pack", "upload"); ok {
			add("warren-pack", ms(pack))
			add("warren-upload", ms(upload))
			add("warren-upload-MB/s", mbps(n, upload))
		}

		// The same bytes through a plain client: down, then up again
		// under another key.
		key := "warren/teams/" + rec.TeamID + "/sha256/" + strings.TrimPrefix(rec.PausedBlob, "sha256:")
		start := time.Now()
		if err := mc.FGetObject(ctx, c.s3.Bucket, key, scratch, minio.GetObjectOptions{}); err != nil {
			b.Fatal(err)
		}
		got := time.Since(start)
		fi, _ := os.Stat(scratch)
		start = time.Now()
		if _, err := mc.FPutObject(ctx, c.s3.Bucket, "bench/plain-copy", scratch, minio.PutObjectOptions{}); err != nil {
			b.Fatal(err)
		}
		put := time.Since(start)
		add("plain-get", ms(got))
		add("plain-get-MB/s", mbps(fi.Size(), got))
		add("plain-put", ms(put))
		add("plain-put-MB/s", mbps(fi.Size(), put))
		mc.RemoveObject(ctx, c.s3.Bucket, "bench/plain-copy", minio.RemoveObjectOptions{})
		os.Remove(scratch)

		if _, err := c.st.UpdateSandbox(ctx, sb.ID, func(s *store.Sandbox) error { s.Node = "gone"; return nil }); err != nil {
			b.Fatal(err)
		}
		// Only wbsb may take it (wbsa keeps a copy it must not use).
		for _, n := range []string{a.name, localNode.name} {
			if err := c.setNode(ctx, n, store.NodeCordoned); err != nil {
				b.Fatal(err)
			}
		}
		time.Sleep(time.Second)
		add("store-resume-other-node", ms(timed("POST", "/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 60}, http.StatusCreated)))
		for _, n := range []string{a.name, localNode.name} {
			if err := c.setNode(ctx, n, store.NodeReady); err != nil {
				b.Fatal(err)
			}
		}
		if rec, err := c.st.GetSandbox(ctx, sb.ID); err != nil || rec.Node != bn.name {
			b.Fatalf("resumed on %q, not %s: %v", rec.Node, bn.name, err)
		}
		if download, unpack, n, ok := logSteps(bn.logPath, "fetched a paused sandbox's blob", sb.ID, "download", "unpack"); ok {
			add("warren-download", ms(download))
			add("warren-download-MB/s", mbps(n, download))
			add("warren-unpack", ms(unpack))
		}
		if r, err := c.exec(ctx, sb, fmt.Sprintf(`test $(stat -c %%s /dev/shm/resident) = %d && echo ok`, mib<<20)); err != nil || r.exit != 0 {
			b.Fatalf("the resumed sandbox lost its memory: %v %+v", err, r)
		}
		timed("DELETE", "/sandboxes/"+sb.ID, nil, http.StatusNoContent)
	}
	for _, name := range order {
		v := series[name]
		slices.Sort(v)
		p50 := v[len(v)/2]
		if strings.HasSuffix(name, "MB/s") {
			b.ReportMetric(p50, fmt.Sprintf("%dMiB-%s-p50", mib, strings.TrimSuffix(name, "-MB/s")+"-MB/s"))
			b.Logf("%d MiB %s: p50 %.0f, min %.0f, all %v", mib, name, p50, v[0], v)
			continue
		}
		b.ReportMetric(p50, fmt.Sprintf("%dMiB-%s-p50-ms", mib, name))
		b.ReportMetric(v[len(v)-1], fmt.Sprintf("%dMiB-%s-max-ms", mib, name))
		b.Logf("%d MiB %s: p50 %.0f ms, max %.0f ms, all %v", mib, name, p50, v[len(v)-1], v)
	}
}

// logSteps reads two durations and the bytes from the last log line of
// msg about sandbox id (text log format).
func logSteps(logPath, msg, id, first, second string) (time.Duration, time.Duration, int64, bool) {
	text, err := os.ReadFile(logPath)
	if err != nil {
		return 0, 0, 0, false
	}
	var line string
	for _, l := range strings.Split(string(text), "\n") {
		if strings.Contains(l, `msg="`+msg+`"`) && strings.Contains(l, "sandbox="+id+" ") {
			line = l
		}
	}
	field := func(name string) string {
		m := regexp.MustCompile(` ` + regexp.QuoteMeta(name) + `=(\S+)`).FindStringSubmatch(line)
		if m == nil {
			return ""
		}
		return m[1]
	}
	d1, err1 := time.ParseDuration(field(first))
	d2, err2 := time.ParseDuration(field(second))
	var n int64
	_, err3 := fmt.Sscan(field("bytes"), &n)
	return d1, d2, n, line != "" && err1 == nil && err2 == nil && err3 == nil
}

// createFromOn creates a sandbox of template tmpl on node name (the
// others cordoned).
func (c *cluster) createFromOn(ctx context.Context, t testing.TB, name, tmpl string) sandbox {
	t.Helper()
	for _, n := range c.nodes {
		if n.name != name {
			if err := c.setNode(ctx, n.name, store.NodeCordoned); err != nil {
				t.Fatal(err)
			}
			defer c.setNode(ctx, n.name, store.NodeReady)
		}
	}
	time.Sleep(time.Second) // the api rereads the nodes every half second
	r, err := c.call(ctx, c.apiKey, "POST", "/sandboxes", map[string]any{"templateID": tmpl, "timeout": 600})
	if err != nil || r.status != http.StatusCreated {
		t.Fatalf("create: %v %v", r, err)
	}
	var out struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if err := json.Unmarshal(r.body, &out); err != nil {
		t.Fatal(err)
	}
	return sandbox{ID: out.SandboxID, EnvdToken: out.EnvdAccessToken}
}

// buildTemplate builds a template named name from base with memoryMB of
// memory, and returns its ID.
func (c *cluster) buildTemplate(ctx context.Context, t testing.TB, name string, memoryMB int) string {
	t.Helper()
	r, err := c.call(ctx, c.apiKey, "POST", "/v3/templates", map[string]any{"name": name, "cpuCount": 2, "memoryMB": memoryMB})
	if err != nil || r.status != http.StatusAccepted {
		t.Fatalf("creating template %s: %v %v", name, r, err)
	}
	var tpl struct{ TemplateID, BuildID string }
	if err := json.Unmarshal(r.body, &tpl); err != nil {
		t.Fatal(err)
	}
	r, err = c.call(ctx, c.apiKey, "POST", "/v2/templates/"+tpl.TemplateID+"/builds/"+tpl.BuildID,
		map[string]any{"fromTemplate": "base", "steps": []map[string]any{{"type": "RUN", "args": []string{"true"}}}})
	if err != nil || r.status != http.StatusAccepted {
		t.Fatalf("starting the build of %s: %v %v", name, r, err)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		r, err := c.call(ctx, c.apiKey, "GET", "/templates/"+tpl.TemplateID+"/builds/"+tpl.BuildID+"/status", nil)
		var st struct{ Status string }
		if err == nil {
			json.Unmarshal(r.body, &st)
		}
		switch st.Status {
		case "ready":
			// Each node fetches its layers at a create (a resume on a
			// node without them does not: not the subject here).
			for _, n := range c.nodes {
				sb := c.createFromOn(ctx, t, n.name, tpl.TemplateID)
				if r, err := c.call(ctx, c.apiKey, "DELETE", "/sandboxes/"+sb.ID, nil); err != nil || r.status != http.StatusNoContent {
					t.Fatalf("killing %s: %v %v", sb.ID, r, err)
				}
			}
			return tpl.TemplateID
		case "error":
			t.Fatalf("the build of %s failed: %s", name, r.body)
		}
		time.Sleep(time.Second)
	}
	t.Fatalf("the build of %s did not end within 5 minutes", name)
	return ""
}
