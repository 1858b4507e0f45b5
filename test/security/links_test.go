package security

import (
	"archive/tar"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Symbolic and hard links in a template at every path Warren writes or
// reads on the host's side of a sandbox: the node writes /etc/hosts,
// mounts over /etc/resolv.conf and /opt/warren/envd, runsc binds /tmp, and
// COPY writes its destination. A template's RUN step makes the link, as
// any tenant can; the host file or directory it points at must stay
// byte-for-byte the same through the build and a sandbox's life.

// linkTemplate builds a template of tm from base whose steps are RUN
// commands as root (the SDK's runCmd(cmd, {user: 'root'})), and returns
// the build.
func linkTemplate(t *testing.T, tm team, name string, cmds ...string) built {
	t.Helper()
	rb, r := newRawBuild(t, tm, name, nil)
	if rb == nil {
		t.Fatalf("POST /v3/templates: %s", r)
	}
	var steps []step
	for _, c := range cmds {
		steps = append(steps, step{Type: "RUN", Args: []string{c, "root"}})
	}
	if r := rb.start(t, "base", steps); r.Status != http.StatusAccepted {
		t.Fatalf("starting the build: %s", r)
	}
	return rb.wait(t)
}

// createFromTemplate tries to create a sandbox of the template; a refusal
// must be a clean E2B error. It returns nil if the create was refused.
func createFromTemplate(t *testing.T, tm team, templateID string) *sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := S.createSandbox(ctx, tm, createOpts{Template: templateID})
	var se *statusError
	if errors.As(err, &se) {
		checkErrorBody(t, se.r)
		t.Logf("the create was refused: %s", se.r)
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killSandbox(t, sb) })
	return sb
}

func TestLinkInTemplateAtEtcHosts(t *testing.T) {
	t.Run("symlink to a host file", func(t *testing.T) {
		afterCase(t)
		target := S.canaries.plant(t, "etc-hosts-target")
		b := linkTemplate(t, S.teamA, "sec-hosts-symlink", "ln -sf "+target+" /etc/hosts")
		if b.Err != nil {
			t.Fatalf("the build failed (a link at /etc/hosts is a valid template): %v\n%s", b.Err, b.log())
		}
		sb := createFromTemplate(t, S.teamA, b.TemplateID)
		if sb == nil {
			t.Fatal("the create was refused: a template with a link at /etc/hosts must still make sandboxes")
		}
		hostsIsOwnFile(t, sb)
	})
	t.Run("hard link to another file of the template", func(t *testing.T) {
		afterCase(t)
		b := linkTemplate(t, S.teamA, "sec-hosts-hardlink", "echo twin-content > /etc/hosts-twin && ln -f /etc/hosts-twin /etc/hosts")
		if b.Err != nil {
			t.Fatalf("the build failed: %v\n%s", b.Err, b.log())
		}
		sb := createFromTemplate(t, S.teamA, b.TemplateID)
		if sb == nil {
			t.Fatal("the create was refused: a template with a hard link at /etc/hosts must still make sandboxes")
		}
		hostsIsOwnFile(t, sb)
		if got := sb.ok(t, "root", "cat /etc/hosts-twin"); got != "twin-content\n" {
			t.Errorf("writing /etc/hosts changed the file it was hard-linked to: /etc/hosts-twin is now %q", got)
		}
	})
	t.Run("directory: a failed create must not tell the host's paths", func(t *testing.T) {
		afterCase(t)
		b := linkTemplate(t, S.teamA, "sec-hosts-dir", "rm -f /etc/hosts && mkdir /etc/hosts && echo x > /etc/hosts/x")
		if b.Err != nil {
			t.Logf("the build failed (allowed): %v", b.Err)
			return
		}
		// Either the node replaces it or the create fails cleanly: a 500
		// must not tell the tenant the host's paths.
		if sb := createFromTemplate(t, S.teamA, b.TemplateID); sb != nil {
			sb.ok(t, "user", "true")
		}
	})
}

// hostsIsOwnFile checks the sandbox's /etc/hosts: a regular file of its own
// that names the sandbox.
func hostsIsOwnFile(t *testing.T, sb *sandbox) {
	t.Helper()
	r := sb.run(t, "root", `[ -f /etc/hosts ] && [ ! -L /etc/hosts ] && grep -F "$(hostname)" /etc/hosts`)
	if r.Exit != 0 || !strings.Contains(r.Stdout, sb.ID) {
		t.Errorf("/etc/hosts in the sandbox is not its own regular file naming %s: %s", sb.ID, r)
	}
}

func TestLinkInTemplateAtEtcHostname(t *testing.T) {
	afterCase(t)
	target := S.canaries.plant(t, "etc-hostname-target")
	b := linkTemplate(t, S.teamA, "sec-hostname-symlink", "ln -sf "+target+" /etc/hostname")
	if b.Err != nil {
		t.Fatalf("the build failed: %v\n%s", b.Err, b.log())
	}
	if sb := createFromTemplate(t, S.teamA, b.TemplateID); sb != nil {
		sb.ok(t, "user", "hostname")
	}
}

// imageTemplate imports a minimal image whose top layer is extra and
// builds a template of tm from it with no steps, so that the template's
// root filesystem holds exactly what the image has: links a RUN step
// cannot make, at paths the build sandbox has mounts on.
func imageTemplate(t *testing.T, tm team, name string, extra ...entry) (built, bool) {
	t.Helper()
	archive := ociArchive(t, "root", tarOf(t, busyboxLayer(t)), tarOf(t, extra))
	if out, err := importImage(t, name+":1", archive); err != nil {
		t.Logf("the import was refused (allowed): %v: %s", err, out)
		return built{}, false
	}
	b := fromImage(t, tm, name, nil)
	if b.Err != nil {
		t.Logf("the build failed or was refused (allowed): %v\n%s", b.Err, b.log())
		return b, false
	}
	return b, true
}

func TestLinkInTemplateAtResolvConf(t *testing.T) {
	afterCase(t)
	target := S.canaries.plant(t, "resolv-conf-target")
	b, ok := imageTemplate(t, S.teamA, "sec-resolv-symlink", symlink("etc/resolv.conf", target))
	if !ok {
		return
	}
	if sb := createFromTemplate(t, S.teamA, b.TemplateID); sb != nil {
		if got := sb.run(t, "root", "cat /etc/resolv.conf"); strings.Contains(got.Stdout, "host canary") {
			t.Errorf("the sandbox reads the host file behind its /etc/resolv.conf link: %s", got)
		}
	}
}

func TestLinkInTemplateAtEnvdBinary(t *testing.T) {
	t.Run("/opt/warren/envd a symlink to a host file", func(t *testing.T) {
		afterCase(t)
		target := S.canaries.plant(t, "envd-target")
		b, ok := imageTemplate(t, S.teamA, "sec-envd-symlink", dir("opt/warren/"), symlink("opt/warren/envd", target))
		if !ok {
			return
		}
		if sb := createFromTemplate(t, S.teamA, b.TemplateID); sb != nil {
			sb.ok(t, "root", "true")
		}
	})
	t.Run("/opt/warren a symlink to a host dir", func(t *testing.T) {
		afterCase(t)
		d := S.canaries.plantDir(t, "opt-warren-target")
		b, ok := imageTemplate(t, S.teamA, "sec-optwarren-symlink", symlink("opt/warren", d))
		if !ok {
			return
		}
		if sb := createFromTemplate(t, S.teamA, b.TemplateID); sb != nil {
			sb.ok(t, "root", "true")
		}
	})
	t.Run("/etc/hosts a hard link to /etc/passwd", func(t *testing.T) {
		afterCase(t)
		// The link must be in the same layer as its target.
		archive := ociArchive(t, "root", tarOf(t, append(busyboxLayer(t), entry{Name: "etc/hosts", Type: tar.TypeLink, Link: "etc/passwd"})))
		if out, err := importImage(t, "sec-hosts-hardlink-image:1", archive); err != nil {
			t.Fatalf("the import failed: %v: %s", err, out)
		}
		b := fromImage(t, S.teamA, "sec-hosts-hardlink-image", nil)
		if b.Err != nil {
			t.Fatalf("the build failed: %v\n%s", b.Err, b.log())
		}
		sb := createFromTemplate(t, S.teamA, b.TemplateID)
		if sb == nil {
			t.Fatal("the create was refused: a template with a hard link at /etc/hosts must still make sandboxes")
		}
		if got := sb.ok(t, "root", "cat /etc/passwd"); !strings.HasPrefix(got, "root:x:0:0:") {
			t.Errorf("writing /etc/hosts changed the file it was hard-linked to: /etc/passwd is now %q", got)
		}
	})
}

func TestLinkInTemplateAtTmp(t *testing.T) {
	afterCase(t)
	d := S.canaries.plantDir(t, "tmp-target")
	// /tmp cannot be replaced in a RUN step (runsc binds the root
	// filesystem's own /tmp there), so the image has the link. A RUN
	// writes to /tmp, a COPY goes through /tmp in the build sandbox, and
	// the sandbox writes there.
	es := []entry{}
	for _, e := range busyboxLayer(t) {
		if e.Name != "tmp/" {
			es = append(es, e)
		}
	}
	// The target exists in the image too, so that the link resolves there.
	for p := ""; ; {
		rest := strings.TrimPrefix(d, p+"/")
		first, _, _ := strings.Cut(rest, "/")
		p += "/" + first
		es = append(es, dir(strings.TrimPrefix(p, "/")+"/"))
		if p == d {
			break
		}
	}
	archive := ociArchive(t, "root", tarOf(t, append(es, symlink("tmp", d))))
	if out, err := importImage(t, "sec-tmp-image:1", archive); err != nil {
		t.Logf("the import was refused (allowed): %v: %s", err, out)
		return
	}
	payload := []entry{file("payload.txt", "payload\n")}
	b := fromImage(t, S.teamA, "sec-tmp-image", &copyStep{entries: payload, src: "payload.txt", dest: "/srv/payload.txt"},
		step{Type: "RUN", Args: []string{"echo from-build > /tmp/written-in-build", "root"}})
	if b.Err != nil {
		t.Logf("the build failed (allowed): %v\n%s", b.Err, b.log())
		return
	}
	if sb := createFromTemplate(t, S.teamA, b.TemplateID); sb != nil {
		sb.run(t, "root", "echo from-sandbox > /tmp/written-in-sandbox")
	}
}

// copyStep is a COPY of a hand-made archive.
type copyStep struct {
	entries   []entry
	src, dest string
}

// fromImage builds a template of tm from the imported image name:1 with
// steps, after which cp (if not nil) is uploaded and copied.
func fromImage(t *testing.T, tm team, name string, cp *copyStep, steps ...step) built {
	t.Helper()
	rb, r := newRawBuild(t, tm, name, nil)
	if rb == nil {
		t.Fatalf("POST /v3/templates: %s", r)
	}
	if cp != nil {
		hash := sdkFilesHash(cp.src, cp.dest, cp.entries)
		if r := rb.upload(t, hash, tarOf(t, cp.entries)); r.Status != http.StatusCreated {
			t.Fatalf("uploading the COPY's files: %s", r)
		}
		steps = append(steps, step{Type: "COPY", Args: []string{cp.src, cp.dest}, FilesHash: hash})
	}
	if steps == nil {
		steps = []step{}
	}
	r, err := S.srv.call(context.Background(), tm, "POST", "/v2/templates/"+rb.TemplateID+"/builds/"+rb.BuildID,
		map[string]any{"fromImage": name + ":1", "steps": steps})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != http.StatusAccepted {
		checkErrorBody(t, r)
		return built{TemplateID: rb.TemplateID, BuildID: rb.BuildID, Err: &statusError{r}}
	}
	return rb.wait(t)
}

func TestLinkInTemplateAtCopyDestination(t *testing.T) {
	afterCase(t)
	target := S.canaries.plant(t, "copy-dest-target")
	d := S.canaries.plantDir(t, "copy-dest-dir")
	// The link targets exist in the build sandbox too (made by the RUN),
	// so that the COPYs go through.
	b := buildDockerfile(t, S.teamA, "sec-copy-dest-symlink",
		"FROM base\nRUN mkdir -p "+d+" && touch "+target+" && ln -s "+target+" /etc/copied && ln -s "+d+" /etc/copied-dir\n"+
			"COPY payload.txt /etc/copied\nCOPY payload.txt /etc/copied-dir/\n",
		map[string]string{"payload.txt": "written through the link\n"})
	if b.Err != nil {
		t.Logf("the build failed (allowed): %v\n%s", b.Err, b.log())
		return
	}
	if sb := createFromTemplate(t, S.teamA, b.TemplateID); sb != nil {
		sb.run(t, "root", "cat /etc/copied")
	}
}
