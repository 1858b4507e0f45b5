// Package baseimage builds Warren's built-in `base` template: Debian 12 by
// debootstrap from this machine's apt mirror, with the tools the E2B SDK
// expects (python3 and python, nodejs, npm, git, curl, sudo) and the user
// `user`.
// The template and its layer live in the image store (internal/image),
// which serialises the build between processes and keeps an old layer
// for the sandboxes still running on it when the recipe changes.
package baseimage

import (
	"context"
	"io"

	"github.com/warren-sandbox/warren/internal/image"
)

// TemplateID is the template every sandbox uses unless told otherwise.
const TemplateID = "base"

// baseRecipe names the recipe in debian.go; change it whenever the recipe
// changes so that `warren setup` rebuilds the base on machines that have an
// old one. The old layer stays (sandboxes may still run on it).
const baseRecipe = "debian-bookworm-v4"

// Options configures Ensure.
type Options struct {
	// Mirror is the Debian mirror; default: the one in this machine's apt
	// sources.
	Mirror string
}

// Ensure builds the base template (Debian 12 with python3 and python, nodejs,
// npm, git, curl, sudo and the user `user`, uid 1000, with passwordless
// sudo) unless a complete one of the current recipe exists, which makes a
// second call return at once. It is safe to call from several processes at
// a time: one builds, the others wait for it. Progress lines (phase and
// elapsed time) go to progress, which may be nil.
func Ensure(ctx context.Context, s *image.Store, opts Options, progress io.Writer) (*image.Template, error) {
	want := image.Template{ID: TemplateID, User: "user", Workdir: "/home/user", Recipe: baseRecipe}
	return s.EnsureTemplate(ctx, want, func(ctx context.Context, dir string, step image.StepFunc, out io.Writer) error {
		return buildDebian(ctx, dir, opts, step, out)
	}, progress)
}
