// Package mountinfo reads /proc/self/mountinfo: which file systems are
// mounted where in this mount namespace; and removes a directory tree with
// whatever is mounted below it (RemoveTree), never deleting files through
// a mount that is still there.
package mountinfo

import (
	"bufio"
	"io"
	"os"
	"strconv"
	"strings"
)

// Entry is one mount.
type Entry struct {
	MountPoint   string
	FSType       string
	Source       string
	SuperOptions []string
}

// Read parses this process's mount table.
func Read() ([]Entry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Parse(f)
}

// Parse reads lines of the mountinfo format:
// id parent maj:min root mountpoint opts [optional...] - fstype source superopts
func Parse(r io.Reader) ([]Entry, error) {
	var out []Entry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 3 {
			continue
		}
		out = append(out, Entry{
			MountPoint:   unescape(pf[4]),
			FSType:       qf[0],
			Source:       unescape(qf[1]),
			SuperOptions: strings.Split(qf[2], ","),
		})
	}
	return out, sc.Err()
}

// unescape undoes the octal escapes (\040 for a space...) of mountinfo.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
