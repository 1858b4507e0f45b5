package dashboard

import (
	"fmt"
	"net/url"
	"strings"
)

// ParsePublicURL checks an operator's --public-url: an absolute http or
// https URL of a host, with no user, path (but "/"), query or fragment,
// since what it names is an origin. The scheme and host come back
// lower-cased.
func ParsePublicURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("--public-url %q: %w", s, err)
	}
	u.Scheme = strings.ToLower(u.Scheme)
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("--public-url %q: want http:// or https://", s)
	case u.Host == "" || u.Hostname() == "":
		return nil, fmt.Errorf("--public-url %q: no host", s)
	case u.User != nil:
		return nil, fmt.Errorf("--public-url %q: no user name or password, an origin is scheme://host[:port]", s)
	case (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.Opaque != "":
		return nil, fmt.Errorf("--public-url %q: an origin is scheme://host[:port], without a path, query or fragment (the dashboard is served at /dashboard/ under it)", s)
	}
	return &url.URL{Scheme: u.Scheme, Host: strings.ToLower(u.Host)}, nil
}
