package server

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/setup"
)

func TestHostDefaultsPerDataDir(t *testing.T) {
	def := Config{DataDir: setup.DefaultDataDir}
	if err := hostDefaults(&def); err != nil {
		t.Fatal(err)
	}
	if def.NetworkPrefix != "wrn" || def.NetworkCIDR != "10.11.0.0/16" || def.RunDir != "/run/warren" || def.CgroupParent != "/warren" {
		t.Errorf("the default data dir's settings changed: %+v", def)
	}
	seen := map[string]string{}
	for i := range 50 {
		dir := fmt.Sprintf("/srv/warren-%d", i)
		c := Config{DataDir: dir}
		if err := hostDefaults(&c); err != nil {
			t.Fatal(err)
		}
		again := Config{DataDir: dir + "/"}
		hostDefaults(&again)
		if hostOf(again) != hostOf(c) {
			t.Errorf("%s: not stable: %+v then %+v", dir, c, again)
		}
		if !strings.HasPrefix(c.NetworkPrefix, "x") || len(c.NetworkPrefix) != 5 ||
			c.RunDir != "/run/warren-"+c.NetworkPrefix[1:] || c.CgroupParent != "/warren-"+c.NetworkPrefix[1:] {
			t.Errorf("%s: %+v", dir, c)
		}
		if other, ok := seen[c.NetworkPrefix]; ok {
			t.Errorf("%s and %s share prefix %s", dir, other, c.NetworkPrefix)
		}
		seen[c.NetworkPrefix] = dir
		var a, b int
		if n, _ := fmt.Sscanf(c.NetworkCIDR, "10.%d.%d.0/16", &a, &b); n != 2 || a < 12 || a > 111 || b != 0 {
			t.Errorf("%s: range %s", dir, c.NetworkCIDR)
		}
	}
	// What is given stays.
	c := Config{DataDir: "/srv/x", NetworkPrefix: "wmine", NetworkCIDR: "10.200.0.0/16", RunDir: "/run/mine", CgroupParent: "/mine"}
	want := c
	hostDefaults(&c)
	if hostOf(c) != hostOf(want) {
		t.Errorf("given settings were replaced: %+v", c)
	}
}

// TestClaimsKeepServersApart: a second server is refused every setting a
// live one holds, and one whose prefix would match the other's
// interfaces; once the first is gone, its settings are free.
func TestClaimsKeepServersApart(t *testing.T) {
	ClaimsDir = t.TempDir() + "/claims"
	defer func() { ClaimsDir = "/run/warren-claims" }()
	a := Config{DataDir: "/srv/a", NetworkPrefix: "wclma", NetworkCIDR: "10.218.0.0/16", RunDir: "/run/warren-clm-a", CgroupParent: "/warren-clm-a"}
	releaseA, err := claimHost(a)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(ClaimsDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("claims dir: %v %v", fi, err)
	}
	b := Config{DataDir: "/srv/b", NetworkPrefix: "wclmb", NetworkCIDR: "10.217.0.0/16", RunDir: "/run/warren-clm-b", CgroupParent: "/warren-clm-b"}
	for _, c := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"the same data dir", func(c *Config) { c.DataDir = a.DataDir }, "--data-dir /srv/a is in use by another warren serve (pid"},
		{"the same prefix", func(c *Config) { c.NetworkPrefix = a.NetworkPrefix }, "--network-prefix wclma is in use"},
		{"the same range", func(c *Config) { c.NetworkCIDR = "10.218.0.0/16" }, "--network-cidr 10.218.0.0/16 is in use"},
		{"the same run dir", func(c *Config) { c.RunDir = a.RunDir + "/" }, "--run-dir /run/warren-clm-a is in use"},
		{"the same cgroup parent", func(c *Config) { c.CgroupParent = "warren-clm-a" }, "--cgroup-parent /warren-clm-a is in use"},
		{"a prefix that matches the other's veths", func(c *Config) { c.NetworkPrefix = "wclmav2" }, "would match each other's interfaces"},
		{"a prefix whose veths the other's matches", func(c *Config) { c.NetworkPrefix = "wclm" }, ""},
	} {
		cfg := b
		c.edit(&cfg)
		release, err := claimHost(cfg)
		if c.want == "" {
			// "wclm" + "v" is not a prefix of "wclma": they are apart.
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			} else {
				release()
			}
			continue
		}
		if err == nil {
			release()
			t.Errorf("%s: claimed while the first server holds it", c.name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "/srv/a") && c.name != "a prefix that matches the other's veths" {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	// Nothing of a refused claim stays held: b claims all of its own now.
	releaseB, err := claimHost(b)
	if err != nil {
		t.Fatalf("b after refusals: %v", err)
	}
	releaseB()
	releaseA()
	// a is gone (and left nothing on the host): its settings are free.
	a2 := a
	a2.DataDir = "/srv/a2"
	release, err := claimHost(a2)
	if err != nil {
		t.Fatalf("a's settings after a stopped: %v", err)
	}
	release()
	// A range the host uses (this test's own loopback) is refused.
	lo := b
	lo.NetworkCIDR = "127.0.0.0/16"
	if release, err := claimHost(lo); err == nil {
		release()
		t.Error("a range overlapping the host's loopback was claimed")
	}
}

func hostOf(c Config) [4]string {
	return [4]string{c.NetworkPrefix, c.NetworkCIDR, c.RunDir, c.CgroupParent}
}
