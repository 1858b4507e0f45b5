package baseimage

import (
	"errors"
	"os"
	"strings"
)

// aptSources are read in this order for the machine's Debian mirror.
var aptSources = []string{"/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"}

// aptMirror returns the Debian mirror this machine's apt uses, so that
// the base is built from the same (possibly local or snapshot) mirror the
// host installs from.
func aptMirror() (string, error) {
	for _, p := range aptSources {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var m string
		if strings.HasSuffix(p, ".sources") {
			m = mirrorFromDeb822(string(b))
		} else {
			m = mirrorFromList(string(b))
		}
		if m != "" {
			return m, nil
		}
	}
	return "", errors.New("baseimage: no Debian mirror found in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list; pass one (--mirror)")
}

// mirrorFromDeb822 picks the first URI of the first enabled "deb" stanza
// that serves a main suite (not -security, whose archive has no full
// distribution for debootstrap).
func mirrorFromDeb822(text string) string {
	for _, stanza := range strings.Split(strings.ReplaceAll(text, "\r", ""), "\n\n") {
		fields := map[string]string{}
		key := ""
		for _, line := range strings.Split(stanza, "\n") {
			if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
				continue
			}
			if line[0] == ' ' || line[0] == '\t' { // continuation
				if key != "" {
					fields[key] += " " + strings.TrimSpace(line)
				}
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			key = strings.ToLower(strings.TrimSpace(k))
			fields[key] = strings.TrimSpace(v)
		}
		if strings.EqualFold(fields["enabled"], "no") || !hasWord(fields["types"], "deb") {
			continue
		}
		if !hasMainSuite(strings.Fields(fields["suites"])) {
			continue
		}
		for _, u := range strings.Fields(fields["uris"]) {
			if usableMirror(u) {
				return u
			}
		}
	}
	return ""
}

// mirrorFromList does the same for the one-line format:
// deb [options] uri suite component...
func mirrorFromList(text string) string {
	for _, line := range strings.Split(text, "\n") {
		line, _, _ = strings.Cut(line, "#")
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") { // options, possibly several words
			for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
				f = f[1:]
			}
			if len(f) > 0 {
				f = f[1:]
			}
		}
		if len(f) >= 2 && usableMirror(f[0]) && hasMainSuite(f[1:2]) {
			return f[0]
		}
	}
	return ""
}

func hasMainSuite(suites []string) bool {
	for _, s := range suites {
		if !strings.Contains(s, "security") && !strings.Contains(s, "/updates") {
			return true
		}
	}
	return false
}

// usableMirror accepts what debootstrap can fetch from.
func usableMirror(u string) bool {
	return strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "file:/")
}

func hasWord(s, w string) bool {
	for _, f := range strings.Fields(s) {
		if f == w {
			return true
		}
	}
	return false
}
