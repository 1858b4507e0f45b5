package image

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/lockfile"
	"github.com/warren-sandbox/warren/internal/mountinfo"
)

// Cleanup removes what a crashed run left in layers/: interrupted
// built-in template builds (layers/.build-*) and layer unpacks and commits
// (layers/.tmp-oci-*, layers/.tmp-commit-*) nobody is running. Call it
// before building or unpacking anything. (Root filesystems of sandboxes
// are internal/rootfs's to clean.)
func (s *Store) Cleanup() error {
	return errors.Join(s.removeStaleBuilds(), s.removeStaleTemps())
}

// removeStaleBuilds removes layers/.build-<templateID> directories whose
// template's build lock is free: a build that was interrupted. A build in
// progress holds the lock and is left alone. A build's scratch dirs
// beside it (<dir>.work, <dir>.root, where a layer built over others has
// its overlay: BuildScratchSuffixes) go with it, under its lock, the
// mounted root first.
func (s *Store) removeStaleBuilds() error {
	builds, _ := filepath.Glob(filepath.Join(s.dir, "layers", ".build-*"))
	byTemplate := map[string][]string{}
	for _, b := range builds {
		tid := strings.TrimPrefix(filepath.Base(b), ".build-")
		for _, suffix := range BuildScratchSuffixes {
			tid = strings.TrimSuffix(tid, suffix)
		}
		byTemplate[tid] = append(byTemplate[tid], b)
	}
	var errs []error
	for tid, dirs := range byTemplate {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // one non-blocking try
		unlock, err := lockfile.Acquire(ctx, s.buildLock(tid))
		if err != nil {
			continue
		}
		// Longest first: the scratch dirs before the layer they overlay.
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			errs = append(errs, mountinfo.RemoveTree(d))
		}
		unlock()
	}
	return errors.Join(errs...)
}

// BuildScratchSuffixes are what a built-in template's build may add to
// its build dir's name for dirs of its own beside it (removeStaleBuilds).
var BuildScratchSuffixes = []string{".work", ".root"}

// removeStaleTemps removes layers/.tmp-oci-*, .tmp-commit-* and
// .tmp-pull-* dirs (and snapshots/.tmp-pull-*) that no unpack, commit or
// pull holds locked: ones a crash or kill left
// behind. A dir younger than a minute is spared too, as its unpack may not
// have taken the lock yet.
func (s *Store) removeStaleTemps() error {
	var tmps []string
	for _, prefix := range []string{OCITempPrefix, CommitTempPrefix, PullTempPrefix} {
		m, _ := filepath.Glob(filepath.Join(s.dir, "layers", prefix+"*"))
		tmps = append(tmps, m...)
	}
	m, _ := filepath.Glob(filepath.Join(s.dir, "snapshots", PullTempPrefix+"*"))
	tmps = append(tmps, m...)
	var errs []error
	for _, t := range tmps {
		fi, err := os.Lstat(t)
		if err != nil || !fi.IsDir() || time.Since(fi.ModTime()) < time.Minute {
			continue
		}
		fd, err := unix.Open(t, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) == nil {
			errs = append(errs, os.RemoveAll(t))
		}
		unix.Close(fd)
	}
	return errors.Join(errs...)
}
