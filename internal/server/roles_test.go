package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckRole(t *testing.T) {
	pg := "postgres://db/warren"
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte(strings.Repeat("z", 64)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("WARREN_CLUSTER_SECRET", "")
	cases := []struct {
		cfg  Config
		want string // "" for no error
	}{
		{Config{}, ""},
		{Config{Role: RoleAll}, ""},
		{Config{Role: "worker"}, "want all, api or node"},
		{Config{Role: RoleAll, NodeAddr: "127.0.0.1:1"}, "--node-addr is for --role node"},
		{Config{Role: RoleAPI, ClusterSecretFile: secretFile}, "--store postgres://"},
		{Config{Role: RoleAPI, StoreURL: "/tmp/w.db", ClusterSecretFile: secretFile}, "--store postgres://"},
		{Config{Role: RoleAPI, StoreURL: pg}, "needs the cluster secret"},
		{Config{Role: RoleAPI, StoreURL: pg, ClusterSecretFile: secretFile}, ""},
		{Config{Role: RoleAPI, StoreURL: pg, ClusterSecretFile: secretFile, NodeAddr: "127.0.0.1:1"}, "--node-addr is for --role node"},
		{Config{Role: RoleNode, StoreURL: pg, ClusterSecretFile: secretFile, NodeName: "n1"}, "needs --node-addr"},
		{Config{Role: RoleNode, StoreURL: pg, ClusterSecretFile: secretFile, NodeName: "local", NodeAddr: "127.0.0.1:1"}, "its own --node-name"},
		{Config{Role: RoleNode, StoreURL: pg, ClusterSecretFile: secretFile, NodeName: "n1", NodeAddr: "127.0.0.1:1"}, ""},
		{Config{Role: RoleNode, StoreURL: pg, ClusterSecretFile: secretFile, NodeName: "n1", NodeAddr: "127.0.0.1:1", AdminAddr: "127.0.0.1:2"}, "--admin-addr is for --role all or api"},
		{Config{Role: RoleAPI, StoreURL: pg, ClusterSecretFile: secretFile, AdminAddr: "127.0.0.1:2"}, ""},
		{Config{Role: RoleNode, StoreURL: pg, ClusterSecretFile: "/nonexistent", NodeName: "n1", NodeAddr: "127.0.0.1:1"}, "--cluster-secret-file"},
	}
	for _, c := range cases {
		cfg := c.cfg
		cl, err := checkRole(&cfg)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v", c.cfg, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		case c.want == "" && (cfg.Role == RoleAll) != (cl == nil):
			t.Errorf("%+v: cluster parts %v", c.cfg, cl)
		}
	}
	// The secret may come from the environment; a short one is refused.
	t.Setenv("WARREN_CLUSTER_SECRET", "short")
	cfg := Config{Role: RoleAPI, StoreURL: pg}
	if _, err := checkRole(&cfg); err == nil || !strings.Contains(err.Error(), "at least 32") {
		t.Errorf("a short secret: %v", err)
	}
	t.Setenv("WARREN_CLUSTER_SECRET", strings.Repeat("e", 32))
	if _, err := checkRole(&cfg); err != nil {
		t.Errorf("the environment's secret: %v", err)
	}
}

func TestCheckPublicURL(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, ""},
		{Config{PublicURL: "https://dash.example.com"}, ""},
		{Config{Role: RoleAPI, PublicURL: "https://dash.example.com/"}, ""},
		{Config{Role: RoleNode, PublicURL: "https://dash.example.com"}, "a node serves no dashboard"},
		{Config{PublicURL: "dash.example.com"}, "want http:// or https://"},
		{Config{PublicURL: "https://dash.example.com/dashboard/"}, "without a path"},
	} {
		err := checkPublicURL(c.cfg)
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
}
