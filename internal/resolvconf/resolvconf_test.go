package resolvconf

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestParse(t *testing.T) {
	c, warnings, err := Parse(strings.NewReader(`# a comment
; another
nameserver 10.255.255.53   # trailing comment
nameserver  1.1.1.1
nameserver not-an-address
nameserver
domain first.example
search corp.example  lab.example ; comment
options ndots:2 timeout:1
options edns0 trust-ad
sortlist 130.155.160.0/255.255.240.0
   nameserver 9.9.9.9
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(c.Nameservers, c.Search, c.Options); got != "[10.255.255.53 1.1.1.1 9.9.9.9] [corp.example lab.example] [ndots:2 timeout:1 edns0 trust-ad]" {
		t.Errorf("parsed %s", got)
	}
	if len(warnings) != 2 || !strings.Contains(warnings[0], `"not-an-address"`) || !strings.Contains(warnings[1], "line 6") {
		t.Errorf("warnings %q", warnings)
	}
}

func TestLoad(t *testing.T) {
	upstream := write(t, "upstream.conf", "# This is /run/systemd/resolve/resolv.conf\nnameserver 10.0.2.3\nnameserver 169.254.169.253\nsearch ec2.internal\n")
	for _, c := range []struct {
		name, content, upstream string
		want                    string // rendered, without the header
		warnings                []string
	}{{
		name:    "plain",
		content: "nameserver 10.255.255.53\nsearch example.com\noptions ndots:1\n",
		want:    "nameserver 10.255.255.53\nsearch example.com\noptions ndots:1\n",
	}, {
		// systemd-resolved's stub: the servers it forwards to instead.
		name:     "stub",
		content:  "nameserver 127.0.0.53\noptions edns0 trust-ad\nsearch .\n",
		upstream: upstream,
		want:     "nameserver 10.0.2.3\nnameserver 169.254.169.253\nsearch ec2.internal\n",
	}, {
		name:     "stub without upstream",
		content:  "nameserver 127.0.0.53\noptions edns0 trust-ad\nsearch .\n",
		upstream: filepath.Join(t.TempDir(), "missing"),
		want:     "search .\noptions edns0 trust-ad\n",
		warnings: []string{"upstream servers are unknown", "dropped nameserver 127.0.0.53", "no nameserver a sandbox can reach"},
	}, {
		// A stub beside another server is not "only the stub": dropped as loopback.
		name:     "stub and more",
		content:  "nameserver 127.0.0.53\nnameserver 192.168.1.1\n",
		upstream: upstream,
		want:     "nameserver 192.168.1.1\n",
		warnings: []string{"dropped nameserver 127.0.0.53"},
	}, {
		name:     "loopback and IPv6",
		content:  "nameserver 127.0.0.1\nnameserver ::1\nnameserver 0.0.0.0\nnameserver fe80::1%eth0\nnameserver 2001:db8::53\nnameserver 172.20.0.10\n",
		want:     "nameserver 172.20.0.10\n",
		warnings: []string{"dropped nameserver 127.0.0.1", "dropped nameserver ::1", "dropped nameserver 0.0.0.0", "dropped nameserver fe80::1%eth0", "dropped nameserver 2001:db8::53"},
	}, {
		name:     "only loopback",
		content:  "nameserver 127.0.0.1\n",
		want:     "",
		warnings: []string{"dropped nameserver 127.0.0.1", "no nameserver a sandbox can reach"},
	}, {
		name:     "more than glibc uses",
		content:  "nameserver 10.0.0.1\nnameserver 10.0.0.1\nnameserver 10.0.0.2\nnameserver 10.0.0.3\nnameserver 10.0.0.4\n",
		want:     "nameserver 10.0.0.1\nnameserver 10.0.0.2\nnameserver 10.0.0.3\n",
		warnings: []string{"dropped nameserver 10.0.0.4: only the first 3"},
	}} {
		t.Run(c.name, func(t *testing.T) {
			path := write(t, "resolv.conf", c.content)
			up := c.upstream
			if up == "" {
				up = filepath.Join(t.TempDir(), "no-upstream")
			}
			cfg, warnings, err := load(path, up)
			if err != nil {
				t.Fatal(err)
			}
			got := string(cfg.Bytes())
			header, body, _ := strings.Cut(got, "\n")
			if !strings.HasPrefix(header, "# Written by Warren from /") || body != c.want {
				t.Errorf("rendered:\n%s\nwant body:\n%s", got, c.want)
			}
			if len(warnings) != len(c.warnings) {
				t.Errorf("warnings %q, want %d", warnings, len(c.warnings))
			}
			for i, w := range c.warnings {
				if i < len(warnings) && !strings.Contains(warnings[i], w) {
					t.Errorf("warning %d: %q, want it to say %q", i, warnings[i], w)
				}
			}
		})
	}
	if _, _, err := Load(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing file loaded")
	}
}

func TestWriteFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	path := filepath.Join(dir, "resolv.conf")
	c := Config{Search: []string{"a.example"}}
	if err := c.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("%v %v", st, err)
	}
	if d, _ := os.Stat(dir); d.Mode().Perm() != 0o700 {
		t.Errorf("directory mode %v", d.Mode())
	}
	// Rewritten by rename: an open reader keeps the old file whole.
	old, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	c.Search = []string{"b.example"}
	if err := c.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	oldBody, _ := io.ReadAll(old)
	newBody, _ := os.ReadFile(path)
	if !strings.Contains(string(oldBody), "a.example") || !strings.Contains(string(newBody), "search b.example\n") {
		t.Errorf("old %q new %q", oldBody, newBody)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}
}
