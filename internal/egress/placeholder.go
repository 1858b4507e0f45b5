package egress

import (
	"errors"
	"fmt"
	"strings"
)

// Placeholders in a rule's header values: ${e2b.secrets.NAME} is replaced
// by the current value of the team's secret NAME, by the egress proxy, for
// each request, so that the value never enters the sandbox. Other ${...}
// text is left as it is; ${e2b.<anything else>} is refused, so that a
// typo is an error at create time rather than a literal sent upstream.

const (
	placeholderOpen = "${e2b."
	secretPrefix    = "${e2b.secrets."
	maxSecretName   = 128
)

// ParsePlaceholders returns the secret names value refers to, in order of
// first appearance, or an error for a malformed or unsupported
// placeholder.
func ParsePlaceholders(value string) ([]string, error) {
	var names []string
	seen := map[string]bool{}
	rest := value
	for {
		i := strings.Index(rest, placeholderOpen)
		if i < 0 {
			return names, nil
		}
		rest = rest[i:]
		end := strings.IndexByte(rest, '}')
		if end < 0 {
			return nil, errors.New("an ${e2b. placeholder is not closed with }")
		}
		inner := rest[:end+1]
		name, ok := strings.CutPrefix(inner, secretPrefix)
		if !ok {
			return nil, fmt.Errorf("placeholder %q is not supported: only ${e2b.secrets.NAME} is (workload identity tokens are not)", inner)
		}
		name = strings.TrimSuffix(name, "}")
		n, err := NormalizeSecretName(name)
		if err != nil {
			return nil, fmt.Errorf("placeholder %q: %v", inner, err)
		}
		if !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
		rest = rest[end+1:]
	}
}

// ExpandPlaceholders replaces every ${e2b.secrets.NAME} in value with
// lookup(NAME). The value was checked by ParsePlaceholders.
func ExpandPlaceholders(value string, lookup func(name string) (string, error)) (string, error) {
	var b strings.Builder
	rest := value
	for {
		i := strings.Index(rest, secretPrefix)
		if i < 0 {
			b.WriteString(rest)
			return b.String(), nil
		}
		b.WriteString(rest[:i])
		rest = rest[i+len(secretPrefix):]
		end := strings.IndexByte(rest, '}')
		if end < 0 {
			return "", errors.New("unclosed placeholder")
		}
		name, err := NormalizeSecretName(rest[:end])
		if err != nil {
			return "", err
		}
		v, err := lookup(name)
		if err != nil {
			return "", err
		}
		b.WriteString(v)
		rest = rest[end+1:]
	}
}

// NormalizeSecretName returns a secret name's canonical (lower-case)
// form: 1-128 letters, digits, '_' or '-', not starting with "sec_"
// (the prefix of secret IDs).
func NormalizeSecretName(name string) (string, error) {
	if name == "" || len(name) > maxSecretName {
		return "", fmt.Errorf("a secret name has 1 to %d characters", maxSecretName)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return "", errors.New("a secret name holds only letters, digits, '_' and '-'")
		}
	}
	name = strings.ToLower(name)
	if strings.HasPrefix(name, "sec_") {
		return "", errors.New("secret names may not start with sec_ (the prefix of secret IDs)")
	}
	return name, nil
}
