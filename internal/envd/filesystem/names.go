package filesystem

import (
	"os/user"
	"strconv"
	"sync"
	"time"
)

// unknownRetry is how long a failed uid/gid lookup is remembered. Caching
// the miss keeps a listing of files from a foreign tarball from re-reading
// /etc/passwd once per entry; expiring it lets an account created later
// (useradd in a template step) show up by name.
const unknownRetry = 5 * time.Second

// names caches uid/gid → name lookups for every EntryInfo.
var names = &nameCache{users: map[uint32]cachedName{}, groups: map[uint32]cachedName{}}

type cachedName struct {
	name    string
	known   bool
	expires time.Time // for unknown ids only
}

type nameCache struct {
	mu     sync.Mutex
	users  map[uint32]cachedName
	groups map[uint32]cachedName
}

func (c *nameCache) user(uid uint32) string {
	return c.lookup(c.users, uid, func(id string) (string, error) {
		u, err := user.LookupId(id)
		if err != nil {
			return "", err
		}
		return u.Username, nil
	})
}

func (c *nameCache) group(gid uint32) string {
	return c.lookup(c.groups, gid, func(id string) (string, error) {
		g, err := user.LookupGroupId(id)
		if err != nil {
			return "", err
		}
		return g.Name, nil
	})
}

// lookup returns the name for id, or id as a decimal string when no account
// has it. The lock is held across the lookup so concurrent listings do not
// all parse /etc/passwd for the same id at once.
func (c *nameCache) lookup(m map[uint32]cachedName, id uint32, find func(string) (string, error)) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if e, ok := m[id]; ok && (e.known || now.Before(e.expires)) {
		return e.name
	}
	s := strconv.FormatUint(uint64(id), 10)
	name, err := find(s)
	if err != nil || name == "" {
		m[id] = cachedName{name: s, expires: now.Add(unknownRetry)}
		return s
	}
	m[id] = cachedName{name: name, known: true}
	return name
}
