package runtime

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/warren-sandbox/warren/internal/envdinfo"
)

func testSpec() Spec {
	return Spec{
		ID:          "sb1",
		RootFS:      "/var/lib/warren/sandboxes/sb1/rootfs",
		EnvdPath:    "/usr/local/bin/envd",
		Args:        []string{"-user", "user"},
		Env:         []string{"LANG=C.UTF-8"},
		AccessToken: "tok",
		NetNSPath:   "/var/run/netns/sb1",
		ResolvConf:  "/etc/warren/resolv.conf",
		Mounts:      []Mount{{Source: "/srv/vol1", Destination: "/mnt/vol"}},
		CPUCount:    2,
		MemoryMB:    512,
	}
}

func TestBuildOCI(t *testing.T) {
	cfg, err := Config{}.withDefaults("runc")
	if err != nil {
		t.Fatal(err)
	}
	s := testSpec()
	if err := s.validate(); err != nil {
		t.Fatal(err)
	}
	o := buildOCI(&s, &cfg, ociOptions{cgroupNS: true, maskHost: true, pidsLimit: 100})

	if o.Root.Path != s.RootFS || o.Root.Readonly {
		t.Errorf("root = %+v", o.Root)
	}
	if o.Hostname != "sb1" {
		t.Errorf("hostname defaults to the ID, got %q", o.Hostname)
	}
	p := o.Process
	if !slices.Equal(p.Args, []string{"/opt/warren/envd", "-user", "user"}) {
		t.Errorf("args = %v", p.Args)
	}
	if p.User.UID != 0 || p.NoNewPrivileges || p.Terminal {
		t.Errorf("process: uid %d, noNewPrivileges %v, terminal %v", p.User.UID, p.NoNewPrivileges, p.Terminal)
	}
	wantEnv := []string{"PATH=" + defaultPath, "LANG=C.UTF-8", "WARREN_ENVD_ACCESS_TOKEN=tok"}
	if !slices.Equal(p.Env, wantEnv) {
		t.Errorf("env = %v, want %v", p.Env, wantEnv)
	}
	for _, c := range []string{"CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL",
		"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_AUDIT_WRITE", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_MKNOD", "CAP_FSETID", "CAP_NET_RAW"} {
		if !slices.Contains(p.Capabilities.Bounding, c) || !slices.Contains(p.Capabilities.Effective, c) {
			t.Errorf("missing %s", c)
		}
	}
	if slices.Contains(p.Capabilities.Bounding, "CAP_SYS_ADMIN") {
		t.Error("CAP_SYS_ADMIN must not be granted")
	}
	if len(p.Rlimits) != 1 || p.Rlimits[0].Type != "RLIMIT_NOFILE" || p.Rlimits[0].Soft > p.Rlimits[0].Hard {
		t.Errorf("rlimits = %+v", p.Rlimits)
	}

	mounts := map[string]specs.Mount{}
	for _, m := range o.Mounts {
		mounts[m.Destination] = m
	}
	for _, d := range []string{"/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys", "/sys/fs/cgroup", "/opt/warren/envd", "/etc/resolv.conf", "/mnt/vol"} {
		if _, ok := mounts[d]; !ok {
			t.Errorf("no mount at %s", d)
		}
	}
	if m := mounts["/opt/warren/envd"]; m.Source != s.EnvdPath || !slices.Contains(m.Options, "ro") {
		t.Errorf("envd mount = %+v", m)
	}
	if m := mounts["/sys"]; !slices.Contains(m.Options, "ro") {
		t.Errorf("/sys must be read-only: %+v", m)
	}
	if m := mounts["/mnt/vol"]; !slices.Contains(m.Options, "rw") {
		t.Errorf("volume mount = %+v", m)
	}
	if _, ok := mounts["/etc/hosts"]; ok {
		t.Error("no /etc/hosts mount unless asked")
	}

	l := o.Linux
	if l.CgroupsPath != "/warren/sb1" {
		t.Errorf("cgroupsPath = %q", l.CgroupsPath)
	}
	var types []specs.LinuxNamespaceType
	for _, n := range l.Namespaces {
		types = append(types, n.Type)
		if n.Type == specs.NetworkNamespace && n.Path != s.NetNSPath {
			t.Errorf("netns path = %q", n.Path)
		}
	}
	for _, want := range []specs.LinuxNamespaceType{specs.PIDNamespace, specs.IPCNamespace, specs.UTSNamespace, specs.MountNamespace, specs.NetworkNamespace, specs.CgroupNamespace} {
		if !slices.Contains(types, want) {
			t.Errorf("missing %s namespace", want)
		}
	}
	r := l.Resources
	if *r.CPU.Period != 100000 || *r.CPU.Quota != 200000 {
		t.Errorf("cpu = %d/%d", *r.CPU.Quota, *r.CPU.Period)
	}
	if *r.Memory.Limit != 512<<20 || *r.Memory.Swap != 512<<20 {
		t.Errorf("memory = %d swap %d", *r.Memory.Limit, *r.Memory.Swap)
	}
	if r.Pids.Limit == nil || *r.Pids.Limit != 100 {
		t.Errorf("pids = %v", r.Pids.Limit)
	}
	if len(l.MaskedPaths) == 0 || len(l.ReadonlyPaths) == 0 {
		t.Error("runc specs mask host paths")
	}
	// It serializes (what the runtimes read).
	if _, err := json.Marshal(o); err != nil {
		t.Fatal(err)
	}
}

func TestBuildOCIRunscDifferences(t *testing.T) {
	cfg, _ := Config{CgroupParent: "/custom/parent"}.withDefaults("runsc")
	s := testSpec()
	s.CPUCount, s.MemoryMB = 0, 0
	r := &Runsc{base: &base{cfg: cfg}}
	o := buildOCI(&s, &cfg, r.ociOptions(&s))
	for _, n := range o.Linux.Namespaces {
		if n.Type == specs.CgroupNamespace {
			t.Error("runsc spec has a cgroup namespace")
		}
	}
	if o.Linux.CgroupsPath != "/custom/parent/sb1" {
		t.Errorf("cgroupsPath = %q", o.Linux.CgroupsPath)
	}
	if o.Linux.Resources.CPU != nil || o.Linux.Resources.Memory != nil {
		t.Error("no CPU/memory limits when CPUCount/MemoryMB are 0")
	}
	if got, want := *o.Linux.Resources.Pids.Limit, int64(defaultPidsLimit*runscPidsFactor+runscPidsBase); got != want {
		t.Errorf("runsc host pids limit = %d, want %d", got, want)
	}
	s.PidsLimit = -1
	if o := buildOCI(&s, &cfg, r.ociOptions(&s)); o.Linux.Resources.Pids != nil {
		t.Error("negative PidsLimit means no limit")
	}
}

func TestSpecValidate(t *testing.T) {
	for name, mut := range map[string]func(*Spec){
		"empty id":      func(s *Spec) { s.ID = "" },
		"slash in id":   func(s *Spec) { s.ID = "a/b" },
		"plus in id":    func(s *Spec) { s.ID = "a+" },
		"relative root": func(s *Spec) { s.RootFS = "rootfs" },
		"no netns":      func(s *Spec) { s.NetNSPath = "" },
		"no envd":       func(s *Spec) { s.EnvdPath = "" },
		"bad env":       func(s *Spec) { s.Env = []string{"NOEQUALS"} },
		"bad mount":     func(s *Spec) { s.Mounts = []Mount{{Source: "rel", Destination: "/x"}} },
		"negative mem":  func(s *Spec) { s.MemoryMB = -1 },
		"relative log":  func(s *Spec) { s.LogPath = "envd.log" },
	} {
		s := testSpec()
		mut(&s)
		if err := s.validate(); err == nil {
			t.Errorf("%s: validate accepted %+v", name, s)
		}
	}
	s := testSpec()
	if err := s.validate(); err != nil {
		t.Errorf("valid spec rejected: %v", err)
	}
}

func TestEnvTokenWins(t *testing.T) {
	s := Spec{Env: []string{"PATH=/bin", envdinfo.AccessTokenEnv + "=old"}, AccessToken: "new"}
	env := buildEnv(&s)
	if !slices.Equal(env, []string{"PATH=/bin", envdinfo.AccessTokenEnv + "=new"}) {
		t.Errorf("env = %v", env)
	}
	if env := buildEnv(&Spec{}); len(env) != 1 || !strings.HasPrefix(env[0], "PATH=") {
		t.Errorf("env without token = %v", env)
	}
}

// runc sandboxes get Docker's default seccomp profile, resolved for the
// sandbox's capabilities; runsc sandboxes none (gVisor filters itself).
func TestSeccompProfile(t *testing.T) {
	sc, err := sandboxSeccomp()
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := Config{}.withDefaults("runc")
	s := testSpec()
	o := buildOCI(&s, &cfg, (&Runc{base: &base{cfg: cfg}, seccomp: sc}).ociOptions(&s))
	l := o.Linux.Seccomp
	if l == nil || l.DefaultAction != specs.ActErrno || l.DefaultErrnoRet == nil || *l.DefaultErrnoRet != 1 {
		t.Fatalf("runc seccomp = %+v, want a default of EPERM", l)
	}
	allowed := map[string]bool{}
	for _, sys := range l.Syscalls {
		if sys.Action == specs.ActAllow && len(sys.Args) == 0 {
			for _, n := range sys.Names {
				allowed[n] = true
			}
		}
	}
	for _, n := range []string{"read", "write", "openat", "execve", "setresuid", "chroot"} {
		if !allowed[n] {
			t.Errorf("%s is not allowed", n)
		}
	}
	for _, n := range []string{"unshare", "setns", "mount", "keyctl", "add_key", "bpf", "kexec_load", "init_module", "userfaultfd", "perf_event_open", "settimeofday", "clone3"} {
		if allowed[n] {
			t.Errorf("%s is allowed unconditionally", n)
		}
	}
	if !slices.ContainsFunc(l.Architectures, func(a specs.Arch) bool { return a == specs.ArchX86_64 || a == specs.ArchAARCH64 }) {
		t.Errorf("architectures %v", l.Architectures)
	}
	if _, err := json.Marshal(o); err != nil {
		t.Fatal(err)
	}

	rs := &Runsc{base: &base{cfg: cfg}}
	if o := buildOCI(&s, &cfg, rs.ociOptions(&s)); o.Linux.Seccomp != nil {
		t.Error("runsc spec has a seccomp profile")
	}
}
