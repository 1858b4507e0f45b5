package filesystem

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"

	pb "github.com/warren-sandbox/warren/proto/envd/filesystem"
)

// maxAnnounced bounds the memory of announced creations (see addTree);
// past it the record restarts, at worst letting a duplicate CREATE through.
const maxAnnounced = 4096

// watchParams are the fields WatchDirRequest and CreateWatcherRequest share.
type watchParams struct {
	recursive, includeEntry, allowNetworkMounts bool
}

// watcher turns fsnotify events below root into E2B filesystem events on
// its events channel, which is closed once the watcher has stopped.
//
// fsnotify watches single directories, so a recursive watcher keeps one
// watch per directory of the tree, adding them as directories appear and
// dropping them as they leave.
type watcher struct {
	root string
	watchParams
	fsw    *fsnotify.Watcher
	events chan *pb.FilesystemEvent

	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}

	// Owned by run (and by newWatcher before run starts).
	dirs      map[string]struct{} // watched directories below root
	movedAway map[string]struct{} // moved directories whose own move report is still due
	announced map[string]struct{} // entries reported by addTree whose inotify CREATE may follow
	last      fsnotify.Event      // previous raw event
}

// newWatcher checks root as E2B does (it must exist, be a directory and,
// unless allowed, not be on a network mount) and starts watching it.
func newWatcher(root string, p watchParams) (*watcher, error) {
	fi, err := os.Stat(root)
	if err != nil {
		return nil, fsError(err, "cannot watch '%s'", root)
	}
	if !fi.IsDir() {
		return nil, invalidArgument("path '%s' is not a directory", root)
	}
	// Watch the real directory: walking a symlinked root would stop at the
	// link, and event names are relative to root either way.
	if real, err := filepath.EvalSymlinks(root); err == nil {
		root = real
	}
	if !p.allowNetworkMounts {
		name, err := networkMount(root)
		if err != nil {
			return nil, fsError(err, "cannot watch '%s'", root)
		}
		if name != "" {
			return nil, invalidArgument("cannot watch '%s': it is on a network filesystem (%s); set allowNetworkMounts to watch it anyway", root, name)
		}
	}
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		// EMFILE: the inotify instance limit (fs.inotify.max_user_instances).
		return nil, connect.NewError(connect.CodeResourceExhausted, errors.New("cannot create a watcher: "+err.Error()))
	}
	w := &watcher{
		root: root, watchParams: p, fsw: fsw,
		events:    make(chan *pb.FilesystemEvent, 256),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
		dirs:      map[string]struct{}{},
		movedAway: map[string]struct{}{},
		announced: map[string]struct{}{},
	}
	if err := fsw.Add(root); err != nil {
		fsw.Close()
		return nil, fsError(err, "cannot watch '%s'", root)
	}
	if p.recursive {
		w.addTree(root, false)
	}
	go w.run()
	return w, nil
}

// close stops the watcher and waits until its goroutine and fsnotify's are
// gone. It may be called any number of times, concurrently.
func (w *watcher) close() {
	w.stopOnce.Do(func() {
		close(w.stop)
		w.fsw.Close()
	})
	<-w.done
}

func (w *watcher) run() {
	defer close(w.done)
	defer close(w.events)
	for {
		select {
		case <-w.stop:
			return
		case ev, ok := <-w.fsw.Events:
			if !ok || !w.handle(ev) {
				return
			}
		case _, ok := <-w.fsw.Errors:
			if !ok {
				return
			}
			// Queue overflow and the like: some events are lost, but the
			// watches still work, so keep going (E2B's SDK has no way to be
			// told about a gap).
		}
	}
}

// handle reports one fsnotify event and keeps the recursive watch set in
// step with the tree. It returns false once the watcher is stopping.
func (w *watcher) handle(ev fsnotify.Event) bool {
	if w.duplicate(ev) {
		return true
	}
	below := w.recursive && ev.Name != w.root
	newDir := false
	if below && ev.Has(fsnotify.Create) {
		if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
			// Watch before reporting: a client that saw the CREATE and then
			// writes inside must be told about it.
			w.watchDir(ev.Name)
			newDir = true
		}
	}
	if !w.emit(ev.Name, ev.Op) {
		return false
	}
	switch {
	case !below:
	case newDir:
		return w.addTree(ev.Name, true)
	case ev.Has(fsnotify.Rename):
		w.forget(ev.Name, true)
	case ev.Has(fsnotify.Remove):
		w.forget(ev.Name, false)
	}
	return true
}

// duplicate reports events that repeat one change. inotify tells both a
// subdirectory's own watch and its parent's about a chmod and a move, and
// fsnotify names both reports with the same path; addTree may also have
// announced an entry whose CREATE was already queued.
func (w *watcher) duplicate(ev fsnotify.Event) bool {
	prev := w.last
	w.last = ev
	if !w.recursive || ev.Name == w.root {
		return false
	}
	switch {
	case ev.Op == fsnotify.Create:
		if _, ok := w.announced[ev.Name]; ok {
			delete(w.announced, ev.Name)
			return true
		}
	case ev.Op == fsnotify.Rename:
		delete(w.announced, ev.Name)
		if _, ok := w.movedAway[ev.Name]; ok {
			delete(w.movedAway, ev.Name)
			return true
		}
	case ev.Op == fsnotify.Remove:
		delete(w.announced, ev.Name)
	case ev.Op == fsnotify.Chmod && prev.Op == ev.Op && prev.Name == ev.Name:
		if _, ok := w.dirs[ev.Name]; ok {
			w.last = fsnotify.Event{} // a second chmod is a new pair
			return true
		}
	}
	return false
}

// addTree watches dir and every directory below it. With announce, each
// entry found below dir is reported as created: it appeared before its
// parent had a watch (mkdir -p, a tree moved in, a quick write into a new
// directory), so inotify never reported it. Unreadable or vanishing
// subdirectories are skipped. It returns false once the watcher is stopping.
func (w *watcher) addTree(dir string, announce bool) bool {
	running := true
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && path != w.root {
			w.watchDir(path) // before announcing, as in handle
		}
		if announce && path != dir {
			if len(w.announced) >= maxAnnounced {
				clear(w.announced)
			}
			w.announced[path] = struct{}{}
			if !w.emit(path, fsnotify.Create) {
				running = false
				return fs.SkipAll
			}
		}
		return nil
	})
	return running
}

// watchDir adds a watch for a directory below root unless it has one.
// Failure (the inotify watch limit, a vanished directory) leaves that
// directory unwatched rather than ending the whole watch.
func (w *watcher) watchDir(path string) {
	if _, ok := w.dirs[path]; ok {
		return
	}
	if w.fsw.Add(path) == nil {
		w.dirs[path] = struct{}{}
	}
}

// forget drops the watches of a directory that left the tree and of all
// below it. A deleted directory's watches are already gone; a moved one's
// keep reporting under the old names, so they are removed here. If fsnotify
// handled the directory's own move report first (our Remove finds no
// watch), that report is still due as a second RENAME: remember to drop it.
func (w *watcher) forget(path string, moved bool) {
	prefix := path + string(filepath.Separator)
	for d := range w.dirs {
		if d != path && !strings.HasPrefix(d, prefix) {
			continue
		}
		delete(w.dirs, d)
		if !moved {
			continue
		}
		if err := w.fsw.Remove(d); d == path && errors.Is(err, fsnotify.ErrNonExistentWatch) {
			w.movedAway[path] = struct{}{}
		}
	}
}

// opTypes maps fsnotify operations to E2B event types, in the order E2B
// reports several operations carried by one event.
var opTypes = []struct {
	op fsnotify.Op
	t  pb.EventType
}{
	{fsnotify.Create, pb.EventType_EVENT_TYPE_CREATE},
	{fsnotify.Rename, pb.EventType_EVENT_TYPE_RENAME},
	{fsnotify.Chmod, pb.EventType_EVENT_TYPE_CHMOD},
	{fsnotify.Write, pb.EventType_EVENT_TYPE_WRITE},
	{fsnotify.Remove, pb.EventType_EVENT_TYPE_REMOVE},
}

// emit sends one E2B event per operation in op, named relative to root
// ("." for root itself). It returns false once the watcher is stopping.
func (w *watcher) emit(path string, op fsnotify.Op) bool {
	name, err := filepath.Rel(w.root, path)
	if err != nil || name == ".." || strings.HasPrefix(name, "../") {
		return true // not below root: nothing the client asked about
	}
	for _, ot := range opTypes {
		if !op.Has(ot.op) {
			continue
		}
		e := &pb.FilesystemEvent{Name: name, Type: ot.t}
		if w.includeEntry && (ot.t == pb.EventType_EVENT_TYPE_CREATE || ot.t == pb.EventType_EVENT_TYPE_WRITE || ot.t == pb.EventType_EVENT_TYPE_CHMOD) {
			// Best effort: the entry may be gone again already.
			if info, err := EntryInfo(path); err == nil {
				e.Entry = info
			}
		}
		select {
		case w.events <- e:
		case <-w.stop:
			return false
		}
	}
	return true
}
