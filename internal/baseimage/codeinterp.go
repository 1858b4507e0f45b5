package baseimage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/codeinterp"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/mountinfo"
)

// CodeInterpreterID is the template `@e2b/code-interpreter` creates
// sandboxes of by default.
const CodeInterpreterID = "code-interpreter-v1"

// CodeInterpreterMemoryMB is the memory of a code-interpreter-v1 sandbox,
// as E2B's template of that name has (2 vCPUs, 2048 MB): one sandbox runs
// a Python kernel with the data libraries loaded, and Node, TypeScript and
// R kernels beside it, which together pass the default 512 MB (measured:
// 512 MB reached after TypeScript, R, JavaScript, scipy, scikit-learn,
// seaborn and statsmodels cells, and the next import stalled).
const CodeInterpreterMemoryMB = 2048

// codeInterpreterRecipe names the recipe below; change it whenever the
// recipe changes. The template's layer ID also names the base layer it
// sits on, so a new base makes a new one.
const codeInterpreterRecipe = "ci-v2"

// codeInterpreterPackages are what a data-analysis agent expects, from
// Debian only (no PyPI): Jupyter's kernel and client for envd's code
// interpreter (internal/codeinterp), the usual Python libraries, the
// TypeScript compiler for TypeScript contexts (Node is in base) and R with
// IRkernel for R contexts. R and its kernel add about 60 MB, TypeScript
// about 65 MB, the libraries past numpy/pandas/matplotlib about 70 MB
// (docs/performance.md).
var codeInterpreterPackages = []string{
	"python3-ipykernel", "python3-jupyter-client",
	"python3-numpy", "python3-pandas", "python3-matplotlib", "python3-pil",
	"python3-scipy", "python3-sklearn", "python3-seaborn", "python3-statsmodels",
	"python3-networkx", "python3-sympy",
	"python3-openpyxl", "python3-xlrd", "python3-xlsxwriter",
	"python3-bs4", "python3-lxml", "python3-requests", "python3-yaml",
	"python3-tabulate", "python3-tqdm", "fonts-dejavu-core",
	"node-typescript",
	"r-base-core", "r-cran-irkernel",
}

// EnsureCodeInterpreter builds the code-interpreter-v1 template on top of
// base (which must exist: Ensure) unless a complete one of the current
// recipe on the current base exists. Its image has codeinterp.MarkerPath,
// which makes envd serve the code interpreter on port 49999.
func EnsureCodeInterpreter(ctx context.Context, s *image.Store, opts Options, progress io.Writer) (*image.Template, error) {
	base, err := s.Template(TemplateID)
	if err != nil {
		return nil, fmt.Errorf("baseimage: %s needs the base template: %w", CodeInterpreterID, err)
	}
	lowers, err := s.LayerDirs(base)
	if err != nil {
		return nil, err
	}
	want := image.Template{
		ID: CodeInterpreterID, Layers: base.Layers, User: base.User, Workdir: base.Workdir,
		Recipe: codeInterpreterRecipe + "-on-" + base.Layers[len(base.Layers)-1],
	}
	return s.EnsureTemplate(ctx, want, func(ctx context.Context, dir string, step image.StepFunc, out io.Writer) error {
		return buildCodeInterpreter(ctx, dir, lowers, opts, step, out)
	}, progress)
}

// buildCodeInterpreter makes the layer in dir: the upper dir of an
// overlay over the base's layers (lowers, bottom first), in which apt
// installs the packages. What apt deletes from the base becomes an
// overlay whiteout, which sandboxes' overlays honour.
func buildCodeInterpreter(ctx context.Context, dir string, lowers []string, opts Options, step image.StepFunc, progress io.Writer) (err error) {
	work, root := dir+".work", dir+".root"
	for _, d := range []string{work, root} {
		if err := mountinfo.RemoveTree(d); err != nil {
			return err
		}
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
		defer mountinfo.RemoveTree(d)
	}
	top := make([]string, len(lowers))
	for i, l := range lowers {
		top[len(lowers)-1-i] = l
	}
	mopts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(top, ":"), dir, work)
	if err := unix.Mount("overlay", root, "overlay", 0, mopts); err != nil {
		return fmt.Errorf("baseimage: mounting the base for %s: %w", CodeInterpreterID, err)
	}
	defer func() {
		if uerr := unix.Unmount(root, 0); uerr != nil && err == nil {
			err = fmt.Errorf("baseimage: unmounting %s: %w", root, uerr)
		}
	}()

	// The base's sources name the mirror it was made from; one given now
	// wins.
	if opts.Mirror != "" {
		sources := fmt.Sprintf("deb %s %s main\n", opts.Mirror, debianSuite)
		if err := os.WriteFile(filepath.Join(root, "etc/apt/sources.list"), []byte(sources), 0o644); err != nil {
			return err
		}
	}
	if err := copyFile("/etc/resolv.conf", filepath.Join(root, "etc/resolv.conf"), 0o644); err != nil {
		return err
	}
	policy := filepath.Join(root, "usr/sbin/policy-rc.d")
	if err := os.WriteFile(policy, []byte("#!/bin/sh\nexit 101\n"), 0o755); err != nil {
		return err
	}
	env := []string{"PATH=" + chrootPath, "HOME=/root", "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive"}
	chroot := func(args ...string) error {
		return run(ctx, progress, env, "chroot", append([]string{root}, args...)...)
	}
	step("apt-get install %s", strings.Join(codeInterpreterPackages, " "))
	if err := chroot("apt-get", "update", "-q"); err != nil {
		return fmt.Errorf("baseimage: apt-get update for %s: %w", CodeInterpreterID, err)
	}
	install := append([]string{"apt-get", "install", "-y", "-q", "--no-install-recommends"}, codeInterpreterPackages...)
	if err := chroot(install...); err != nil {
		return fmt.Errorf("baseimage: installing the packages of %s: %w", CodeInterpreterID, err)
	}
	step("cleaning up")
	if err := chroot("apt-get", "clean"); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, "etc/resolv.conf"), nil, 0o644); err != nil {
		return err
	}
	if err := os.Remove(policy); err != nil {
		return err
	}
	for _, pattern := range []string{"var/lib/apt/lists/*", "var/cache/apt/*.bin", "var/log/apt/*", "var/log/dpkg.log", "var/cache/debconf/*-old"} {
		matches, _ := filepath.Glob(filepath.Join(root, pattern))
		for _, m := range matches {
			if b := filepath.Base(m); b == "partial" || b == "lock" {
				continue
			}
			if err := os.RemoveAll(m); err != nil {
				return err
			}
		}
	}
	// The marker that makes envd serve the code interpreter.
	marker := filepath.Join(root, codeinterp.MarkerPath)
	if err := os.MkdirAll(filepath.Dir(marker), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(marker, []byte("# envd serves the code interpreter on port 49999 (Warren)\n"), 0o644); err != nil {
		return err
	}
	for what, path := range map[string]string{
		"python3 Jupyter kernel": "usr/share/jupyter/kernels/python3/kernel.json",
		"IRkernel":               "usr/lib/R/site-library/IRkernel/DESCRIPTION",
		"TypeScript compiler":    "usr/share/nodejs/typescript/package.json",
	} {
		if _, err := os.Stat(filepath.Join(root, path)); errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("baseimage: %s has no %s after the install (%s)", CodeInterpreterID, what, path)
		}
	}
	return nil
}
