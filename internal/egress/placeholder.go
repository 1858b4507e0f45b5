package egress

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Placeholders in a rule's header values, replaced by the egress proxy
// for each request, so that no value ever enters the sandbox:
// ${e2b.secrets.NAME} by the current value of the team's secret NAME,
// and ${e2b.identity.tokens.NAME} by a fresh workload identity token
// (a JWT-SVID) for the audience the sandbox's iam.tokens gave NAME.
// Other ${...} text is left as it is; ${e2b.<anything else>} is refused,
// so that a typo is an error at create time rather than a literal sent
// upstream.

const (
	placeholderOpen = "${e2b."
	secretPrefix    = "${e2b.secrets."
	tokenPrefix     = "${e2b.identity.tokens."
	maxSecretName   = 128
	// MaxTokenName bounds an identity token's name.
	MaxTokenName = 128
)

// Refs are the names a header value's placeholders refer to, each once,
// in order of first appearance.
type Refs struct {
	Secrets []string // canonical secret names
	Tokens  []string // identity token names (case-sensitive)
}

// ParsePlaceholders returns what value refers to, or an error for a
// malformed or unsupported placeholder.
func ParsePlaceholders(value string) (Refs, error) {
	var refs Refs
	seen := map[string]bool{}
	err := walkPlaceholders(value, func(kind, name string) (string, error) {
		if !seen[kind+name] {
			seen[kind+name] = true
			if kind == secretPrefix {
				refs.Secrets = append(refs.Secrets, name)
			} else {
				refs.Tokens = append(refs.Tokens, name)
			}
		}
		return "", nil
	}, nil)
	return refs, err
}

// ExpandPlaceholders replaces every placeholder in value: a secret's by
// secret(NAME), a token's by token(NAME).
func ExpandPlaceholders(value string, secret, token func(name string) (string, error)) (string, error) {
	var b strings.Builder
	err := walkPlaceholders(value, func(kind, name string) (string, error) {
		if kind == secretPrefix {
			return secret(name)
		}
		return token(name)
	}, &b)
	return b.String(), err
}

// walkPlaceholders calls f for each placeholder of value (kind its
// prefix, name checked) and, if b is not nil, writes value to it with
// each placeholder replaced by what f returns.
func walkPlaceholders(value string, f func(kind, name string) (string, error), b *strings.Builder) error {
	rest := value
	for {
		i := strings.Index(rest, placeholderOpen)
		if i < 0 {
			if b != nil {
				b.WriteString(rest)
			}
			return nil
		}
		if b != nil {
			b.WriteString(rest[:i])
		}
		rest = rest[i:]
		end := strings.IndexByte(rest, '}')
		if end < 0 {
			return errors.New("an ${e2b. placeholder is not closed with }")
		}
		inner := rest[:end+1]
		var kind, name string
		if n, ok := strings.CutPrefix(inner, secretPrefix); ok {
			canon, err := NormalizeSecretName(strings.TrimSuffix(n, "}"))
			if err != nil {
				return fmt.Errorf("placeholder %q: %v", inner, err)
			}
			kind, name = secretPrefix, canon
		} else if n, ok := strings.CutPrefix(inner, tokenPrefix); ok {
			name = strings.TrimSuffix(n, "}")
			if err := CheckTokenName(name); err != nil {
				return fmt.Errorf("placeholder %q: %v", inner, err)
			}
			kind = tokenPrefix
		} else {
			return fmt.Errorf("placeholder %q is not supported: only ${e2b.secrets.NAME} and ${e2b.identity.tokens.NAME} are", inner)
		}
		v, err := f(kind, name)
		if err != nil {
			return err
		}
		if b != nil {
			b.WriteString(v)
		}
		rest = rest[end+1:]
	}
}

// CheckTokenName checks an identity token's name, as E2B's SDKs do: not
// empty, no '{', '}' or control characters (a name lives inside its
// placeholder, which the first '}' ends), and at most MaxTokenName
// bytes; it must also be valid UTF-8 in a header.
func CheckTokenName(name string) error {
	if name == "" || len(name) > MaxTokenName {
		return fmt.Errorf("a token name has 1 to %d characters", MaxTokenName)
	}
	if !utf8.ValidString(name) {
		return errors.New("a token name is UTF-8")
	}
	for _, c := range name {
		if c == '{' || c == '}' || c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0xa0) {
			return errors.New("a token name cannot hold '{', '}' or control characters")
		}
	}
	return nil
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
