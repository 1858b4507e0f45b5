package codeinterp

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The memory guard. Under gVisor every guest page lives in the sentry's
// memory, so a sandbox past its memory limit is not one process killed by
// an OOM killer but the whole sandbox (envd and this server with it)
// killed by the host's: gVisor has no OOM killer of its own. The guard
// reads the guest's memory from /proc/meminfo (gVisor sizes MemTotal from
// the sandbox's limit and counts every guest page) and, when what is
// available falls below Config.MemoryReserve, kills the process group of
// the context whose processes hold the most, or failing that the sandbox
// user's biggest process: a cell that allocates without bound (or forks
// without bound) loses its kernel, the sandbox and the server live.

// outOfMemoryReason begins the error of a cell whose kernel the guard
// killed (named KernelDied, as a kernel that died of its own).
const outOfMemoryReason = "the sandbox ran out of memory"

// memInfo is the guest's memory, in bytes.
type memInfo struct {
	Total, Available uint64
}

// procInfo is one guest process as the guard sees it.
type procInfo struct {
	PID, PGID int
	UID       uint32
	RSS       uint64 // bytes
}

// victim is what the guard kills: a context's process group (Context set)
// or one process (PID set, Context nil).
type victim struct {
	Context *execContext
	PGID    int
	PID     int
	Bytes   uint64
}

// guardGroup is a context's kernel process group, for chooseVictim.
type guardGroup struct {
	c    *execContext
	pgid int
	busy bool // a cell runs
}

// busyVictim is the one group whose context runs a cell, if exactly one
// does: under pressure that cell is what allocates, and killing it needs
// no walk of /proc, which takes seconds when a fork bomb keeps gVisor's
// sentry busy (measured: the sandbox died before a walk ended).
func busyVictim(groups []guardGroup) (victim, bool) {
	var v victim
	n := 0
	for _, g := range groups {
		if g.busy {
			v, n = victim{Context: g.c, PGID: g.pgid}, n+1
		}
	}
	return v, n == 1
}

// chooseVictim picks what to kill: the group among groups whose processes
// hold the most resident memory, or, if the user's processes outside them
// hold more than any group (a cell's child that left its group with
// setsid, a command's process), the user's biggest process. Processes of
// other users (root: envd, this server) are never chosen, nor, unless
// strays, processes outside the groups (the kernels run as this server's
// own user: a stray may be the server). ok is false when nothing of the
// user's holds memory.
func chooseVictim(procs []procInfo, groups []guardGroup, uid uint32, strays bool) (v victim, ok bool) {
	byGroup := make(map[int]uint64, len(groups))
	for _, g := range groups {
		byGroup[g.pgid] = 0
	}
	var biggest procInfo
	for _, p := range procs {
		if p.UID != uid {
			continue
		}
		if _, in := byGroup[p.PGID]; in {
			byGroup[p.PGID] += p.RSS
			continue
		}
		if strays && p.RSS > biggest.RSS {
			biggest = p
		}
	}
	for _, g := range groups {
		if b := byGroup[g.pgid]; b > v.Bytes {
			v = victim{Context: g.c, PGID: g.pgid, Bytes: b}
		}
	}
	if biggest.RSS > v.Bytes {
		v = victim{PID: biggest.PID, Bytes: biggest.RSS}
	}
	return v, v.Bytes > 0
}

// underPressure reports whether the guest's available memory is below
// reserve.
func underPressure(m memInfo, reserve uint64) bool {
	return m.Total > 0 && m.Available < reserve
}

// defaultReserve is the reserve for a guest of total bytes: 1/8 of it,
// at least 64 MiB. Measured under gVisor: a fork of a Python kernel with
// pandas loaded costs the guest ~47 MiB (its pages are copied, not
// shared), so a fork bomb in a Python cell eats 2 GiB in ~2 s; the
// reserve is the guard's time to see it and for the killed processes to
// exit. The sentry's own memory, which the guest does not see, adds a
// little (~40 MiB at 30 forked kernels).
func defaultReserve(total uint64) uint64 {
	return max(total/8, 64<<20)
}

// readMemInfo reads MemTotal and MemAvailable from a meminfo file.
func readMemInfo(path string) (memInfo, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return memInfo{}, err
	}
	var m memInfo
	var haveAvail bool
	for line := range bytes.Lines(b) {
		name, rest, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		var dst *uint64
		switch string(name) {
		case "MemTotal":
			dst = &m.Total
		case "MemAvailable":
			dst, haveAvail = &m.Available, true
		default:
			continue
		}
		f := strings.Fields(string(rest))
		if len(f) == 0 {
			return memInfo{}, fmt.Errorf("%s: bad %s line", path, name)
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return memInfo{}, fmt.Errorf("%s: %s: %w", path, name, err)
		}
		*dst = n << 10 // kB
	}
	if m.Total == 0 || !haveAvail {
		return memInfo{}, fmt.Errorf("%s: no MemTotal or MemAvailable", path)
	}
	return m, nil
}

// readProcs lists the processes under a /proc directory with their group,
// real user and resident memory. Processes that exit meanwhile are
// skipped.
func readProcs(procDir string) ([]procInfo, error) {
	ents, err := os.ReadDir(procDir)
	if err != nil {
		return nil, err
	}
	page := uint64(os.Getpagesize())
	out := make([]procInfo, 0, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		p, err := readProc(filepath.Join(procDir, e.Name()), pid, page)
		if err != nil {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

func readProc(dir string, pid int, page uint64) (procInfo, error) {
	p := procInfo{PID: pid}
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return p, err
	}
	// pid (comm) state ppid pgrp ...: comm may hold spaces and parens.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return p, errors.New("bad stat")
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 3 {
		return p, errors.New("bad stat")
	}
	if p.PGID, err = strconv.Atoi(f[2]); err != nil {
		return p, err
	}
	statm, err := os.ReadFile(filepath.Join(dir, "statm"))
	if err != nil {
		return p, err
	}
	if f := strings.Fields(string(statm)); len(f) >= 2 {
		rss, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return p, err
		}
		p.RSS = rss * page
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return p, err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		p.UID = st.Uid
	}
	return p, nil
}

// guardMemory polls the guest's memory until the server closes: every
// MemoryCheckInterval, and every nearInterval once available memory is
// within nearFactor reserves (a forking kernel under gVisor takes tens of
// megabytes a fork: the last hundreds go in a fraction of a second).
// Idle, it costs one read of /proc/meminfo per interval; /proc is walked
// only under pressure.
func (s *Server) guardMemory() {
	var g guard
	for {
		wait := s.cfg.MemoryCheckInterval
		if g.near {
			wait = min(wait, nearInterval)
		}
		select {
		case <-s.done:
			return
		case <-time.After(wait):
		}
		s.checkMemory(&g)
	}
}

const (
	nearInterval = 10 * time.Millisecond
	nearFactor   = 3
	// killGrace is how long the guard waits for a victim's memory to be
	// freed before it picks another: memory comes back only once the
	// victim's processes have exited.
	killGrace = 2 * time.Second
)

// guard is the memory guard's state between checks.
type guard struct {
	near bool // available memory is within nearFactor reserves
	// The last victim, while it may still be freeing its memory.
	last      victim
	lastUntil time.Time
}

// checkMemory kills one victim if the guest is short of memory, and
// returns it. While the previous victim is still exiting (within
// killGrace), it kills that one again (a fork bomb forks while its group
// is being killed) instead of choosing another.
func (s *Server) checkMemory(g *guard) (victim, bool) {
	m, err := s.memInfo()
	if err != nil {
		g.near = false
		return victim{}, false
	}
	reserve := s.cfg.MemoryReserve
	if reserve == 0 {
		reserve = defaultReserve(m.Total)
	}
	g.near = underPressure(m, nearFactor*reserve)
	if !underPressure(m, reserve) {
		return victim{}, false
	}
	if g.last.Bytes > 0 && s.now().Before(g.lastUntil) && s.killVictim(g.last) {
		return g.last, false
	}
	groups := s.kernelGroups()
	v, ok := busyVictim(groups)
	if !ok {
		procs, err := s.procs()
		if err != nil {
			return victim{}, false
		}
		uid := s.uid()
		if v, ok = chooseVictim(procs, groups, uid, uid != uint32(os.Getuid())); !ok {
			return victim{}, false
		}
	}
	msg := fmt.Sprintf(outOfMemoryReason+" (%d MiB available of %d MiB): Warren killed this context's kernel, the one running a cell; its state is lost", m.Available>>20, m.Total>>20)
	if v.Bytes > 0 {
		msg = fmt.Sprintf(outOfMemoryReason+" (%d MiB available of %d MiB): Warren killed this context's kernel, which held %d MiB; its state is lost", m.Available>>20, m.Total>>20, v.Bytes>>20)
	}
	if v.Context != nil {
		s.cfg.Log.Warn("codeinterp: low memory: killing a context's kernel", "context", v.Context.ID, "pgid", v.PGID, "rss", v.Bytes, "available", m.Available)
		v.Context.killKernel(v.PGID, msg)
	} else {
		s.cfg.Log.Warn("codeinterp: low memory: killing the user's biggest process", "pid", v.PID, "rss", v.Bytes, "available", m.Available)
	}
	s.killVictim(v)
	g.last, g.lastUntil = v, s.now().Add(killGrace)
	g.last.Bytes = max(v.Bytes, 1) // a victim, even if its size is unknown
	return v, true
}

// killVictim sends SIGKILL to v's group or process; it reports whether
// there was anything left to kill.
func (s *Server) killVictim(v victim) bool {
	target := v.PID
	if v.PGID != 0 {
		target = -v.PGID
	}
	return s.signal(target, syscall.SIGKILL) == nil
}

// kernelGroups lists the process groups of the contexts' live kernels.
func (s *Server) kernelGroups() []guardGroup {
	s.mu.Lock()
	cs := make([]*execContext, 0, len(s.contexts))
	for _, c := range s.contexts {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	var out []guardGroup
	for _, c := range cs {
		c.mu.Lock()
		if c.k != nil {
			out = append(out, guardGroup{c: c, pgid: c.k.pid, busy: len(c.turn) > 0})
		}
		c.mu.Unlock()
	}
	return out
}

// uid is the kernels' user.
func (s *Server) uid() uint32 {
	if s.cfg.User != nil {
		return s.cfg.User.UID
	}
	return uint32(os.Getuid())
}
