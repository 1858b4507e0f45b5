// Package dockerfile translates a Dockerfile into a build spec
// (internal/buildspec) with buildkit's parser, the way the E2B SDK's
// fromDockerfile does. The builder uses it for rebuilds from a Dockerfile
// string, and `warren template build` (internal/templateclient) on the
// client side, which is why it imports nothing of the server.
package dockerfile

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
	"github.com/warren-sandbox/warren/internal/buildspec"
)

// DefaultReadyCmd is the ready command a Dockerfile's CMD or ENTRYPOINT
// gets, as the E2B SDK's fromDockerfile does (waitForTimeout(20s)).
const DefaultReadyCmd = "sleep 20"

// Parse translates a single-stage Dockerfile into a build Spec
// the way the E2B SDK's fromDockerfile does:
//
//   - FROM image → FromImage (--platform and "AS name" are ignored; a
//     second FROM is an error). ARGs before FROM may be used in it.
//   - The steps begin with USER root and WORKDIR / (Docker's defaults) and
//     end with USER user and WORKDIR /home/user (E2B's defaults) unless the
//     Dockerfile set them.
//   - RUN → RUN [command]; the exec form is shell-quoted and joined. A
//     heredoc is kept as a shell heredoc, or run as the script when it is
//     the whole command.
//   - COPY/ADD src... dest → one COPY [src, dest, user, mode] per source,
//     user from --chown, mode from --chmod; FilesHash is left to the
//     caller. ADD of a URL and COPY --from are errors.
//   - ENV and ARG → ENV [k, v, ...] (ARG without a default → "").
//   - WORKDIR → WORKDIR [path]; USER → USER [name] (":group" dropped).
//   - CMD/ENTRYPOINT → StartCmd (ENTRYPOINT then CMD), ReadyCmd "sleep 20".
//
// Variables defined by earlier ENV/ARG instructions are expanded in the
// words of COPY, ADD, WORKDIR, USER, ENV and ARG, as Docker does; other
// references ($PATH, $HOME) are kept as written. Any other instruction is
// an error. Error messages name the Dockerfile line.
func Parse(text string) (buildspec.Spec, error) {
	if i := strings.IndexByte(text, 0); i >= 0 {
		return buildspec.Spec{}, fmt.Errorf("Dockerfile line %d: a NUL byte", strings.Count(text[:i], "\n")+1)
	}
	res, err := parser.Parse(strings.NewReader(text))
	if err != nil {
		var le *parser.LocationError
		if errors.As(err, &le) && len(le.Locations) > 0 && len(le.Locations[0]) > 0 {
			return buildspec.Spec{}, fmt.Errorf("Dockerfile line %d: %v", le.Locations[0][0].Start.Line, le.Unwrap())
		}
		return buildspec.Spec{}, fmt.Errorf("Dockerfile: %w", err)
	}
	p := &dockerfileParser{
		lex:        shell.NewLex(res.EscapeToken),
		vars:       map[string]string{},
		globalArgs: map[string]string{},
	}
	p.lex.SkipUnsetEnv = true
	for _, n := range res.AST.Children {
		if err := p.instruction(n); err != nil {
			return buildspec.Spec{}, err
		}
	}
	if !p.seenFrom {
		return buildspec.Spec{}, errors.New("Dockerfile must contain a FROM instruction")
	}
	s := p.spec
	if p.entrypoint != "" || p.cmd != "" {
		switch {
		case p.entrypoint == "":
			s.StartCmd = p.cmd
		case p.cmd == "" || !p.entrypointExec:
			// A shell-form ENTRYPOINT ignores CMD, as in Docker.
			s.StartCmd = p.entrypoint
		default:
			s.StartCmd = p.entrypoint + " " + p.cmd
		}
		s.ReadyCmd = DefaultReadyCmd
	}
	if !p.userSet {
		s.Steps = append(s.Steps, buildspec.Step{Type: "USER", Args: []string{"user"}})
	}
	if !p.workdirSet {
		s.Steps = append(s.Steps, buildspec.Step{Type: "WORKDIR", Args: []string{"/home/user"}})
	}
	return s, nil
}

type dockerfileParser struct {
	spec       buildspec.Spec
	lex        *shell.Lex
	vars       map[string]string // ENV and ARG values so far, for expansion
	globalArgs map[string]string // ARGs before FROM
	varKeys    []string
	seenFrom   bool
	userSet    bool
	workdirSet bool

	entrypoint     string
	entrypointExec bool
	cmd            string
}

// Get and Keys make the parser the lexer's environment.
func (p *dockerfileParser) Get(k string) (string, bool) {
	v, ok := p.vars[k]
	return v, ok
}

func (p *dockerfileParser) Keys() []string { return p.varKeys }

func (p *dockerfileParser) setVar(k, v string) {
	if _, ok := p.vars[k]; !ok {
		p.varKeys = append(p.varKeys, k)
	}
	p.vars[k] = v
}

// word removes a word's quotes and escapes and expands the variables
// defined so far.
func (p *dockerfileParser) word(w string, line int) (string, error) {
	out, _, err := p.lex.ProcessWord(w, p)
	if err != nil {
		return "", fmt.Errorf("Dockerfile line %d: %v", line, err)
	}
	return out, nil
}

func (p *dockerfileParser) step(typ string, args ...string) {
	p.spec.Steps = append(p.spec.Steps, buildspec.Step{Type: typ, Args: args})
}

func args(n *parser.Node) []string {
	var out []string
	for x := n.Next; x != nil; x = x.Next {
		out = append(out, x.Value)
	}
	return out
}

func (p *dockerfileParser) instruction(n *parser.Node) error {
	ins := strings.ToUpper(n.Value)
	line := n.StartLine
	if !p.seenFrom && ins != "FROM" && ins != "ARG" {
		return fmt.Errorf("Dockerfile line %d: %s before FROM", line, ins)
	}
	lineErr := func(format string, a ...any) error {
		return fmt.Errorf("Dockerfile line %d: %s", line, fmt.Sprintf(format, a...))
	}
	switch ins {
	case "FROM", "RUN", "COPY", "ADD": // flags checked below
	case "ENV", "ARG", "WORKDIR", "USER", "CMD", "ENTRYPOINT":
		if len(n.Flags) > 0 {
			return lineErr("%s: unsupported flag %s", ins, n.Flags[0])
		}
	default:
		return fmt.Errorf("unsupported Dockerfile instruction %s on line %d", ins, line)
	}
	switch ins {
	case "FROM":
		if p.seenFrom {
			return fmt.Errorf("multi-stage Dockerfiles are not supported (line %d)", line)
		}
		for _, f := range n.Flags {
			if !strings.HasPrefix(f, "--platform=") {
				return lineErr("FROM: unsupported flag %s", f)
			}
		}
		a := args(n)
		if len(a) == 0 {
			return lineErr("FROM requires an image")
		}
		img, err := p.word(a[0], line)
		if err != nil {
			return err
		}
		if img == "" {
			return lineErr("FROM: empty image name")
		}
		p.seenFrom = true
		p.spec.FromImage = img
		// ARGs before FROM are only in scope for FROM itself.
		p.vars = map[string]string{}
		p.varKeys = nil
		p.step("USER", "root")
		p.step("WORKDIR", "/")

	case "RUN":
		for _, f := range n.Flags {
			// A cache mount only speeds up Docker builds: running without
			// one gives the same result.
			if !strings.HasPrefix(f, "--mount=type=cache") {
				return lineErr("RUN: unsupported flag %s", f)
			}
		}
		cmd, err := runCommand(n)
		if err != nil {
			return lineErr("%v", err)
		}
		if strings.TrimSpace(cmd) == "" {
			return lineErr("RUN requires a command")
		}
		p.step("RUN", cmd)

	case "COPY", "ADD":
		return p.copy(n, ins, lineErr)

	case "ENV":
		a := args(n)
		if len(a) == 0 || len(a)%3 != 0 {
			return lineErr("ENV requires name=value")
		}
		var kv []string
		for i := 0; i < len(a); i += 3 {
			k, err := p.word(a[i], line)
			if err != nil {
				return err
			}
			v, err := p.word(a[i+1], line)
			if err != nil {
				return err
			}
			if !validVarName(k) {
				return lineErr("ENV: invalid name %q", k)
			}
			kv = append(kv, k, v)
		}
		// Values are expanded with the variables as they were before the
		// instruction, as Docker does.
		for i := 0; i < len(kv); i += 2 {
			p.setVar(kv[i], kv[i+1])
		}
		p.step("ENV", kv...)

	case "ARG":
		a := args(n)
		if len(a) == 0 {
			return lineErr("ARG requires a name")
		}
		var kv []string
		for _, w := range a {
			k, v, hasDefault := strings.Cut(w, "=")
			if !validVarName(k) {
				return lineErr("ARG: invalid name %q", k)
			}
			if hasDefault {
				var err error
				if v, err = p.word(v, line); err != nil {
					return err
				}
			} else if p.seenFrom {
				// ARG name in the stage takes the default of a global ARG.
				v = p.globalArgs[k]
			}
			if !p.seenFrom {
				p.globalArgs[k] = v
			}
			p.setVar(k, v)
			kv = append(kv, k, v)
		}
		if p.seenFrom {
			p.step("ENV", kv...)
		}

	case "WORKDIR":
		a := args(n)
		if len(a) != 1 {
			return lineErr("WORKDIR requires exactly one path")
		}
		dir, err := p.word(a[0], line)
		if err != nil {
			return err
		}
		if dir == "" {
			return lineErr("WORKDIR: empty path")
		}
		p.step("WORKDIR", dir)
		p.workdirSet = true

	case "USER":
		a := args(n)
		if len(a) != 1 {
			return lineErr("USER requires exactly one user")
		}
		u, err := p.word(a[0], line)
		if err != nil {
			return err
		}
		u, _, _ = strings.Cut(u, ":")
		if u == "" {
			return lineErr("USER: empty user")
		}
		p.step("USER", u)
		p.userSet = true

	case "CMD", "ENTRYPOINT":
		cmd := commandLine(n)
		if ins == "CMD" {
			p.cmd = cmd
		} else {
			p.entrypoint = cmd
			p.entrypointExec = n.Attributes["json"]
		}

	}
	return nil
}

func (p *dockerfileParser) copy(n *parser.Node, ins string, lineErr func(string, ...any) error) error {
	line := n.StartLine
	var user, mode string
	for _, f := range n.Flags {
		name, val, _ := strings.Cut(f, "=")
		switch name {
		case "--chown":
			v, err := p.word(val, line)
			if err != nil {
				return err
			}
			user, _, _ = strings.Cut(v, ":")
		case "--chmod":
			v, err := p.word(val, line)
			if err != nil {
				return err
			}
			m, err := strconv.ParseUint(v, 8, 32)
			if err != nil || m > 0o7777 {
				return lineErr("%s: --chmod=%s: only octal modes are supported", ins, val)
			}
			mode = fmt.Sprintf("%04o", m)
		case "--from":
			return lineErr("%s --from is not supported (multi-stage builds are not supported)", ins)
		case "--link":
			// Only changes how Docker stores the layer.
		default:
			return lineErr("%s: unsupported flag %s", ins, f)
		}
	}
	if len(n.Heredocs) > 0 {
		return lineErr("%s with a heredoc is not supported", ins)
	}
	a := args(n)
	if len(a) < 2 {
		return lineErr("%s requires at least a source and a destination", ins)
	}
	words := a // the JSON form is already unquoted
	if !n.Attributes["json"] {
		words = make([]string, len(a))
		for i, w := range a {
			v, err := p.word(w, line)
			if err != nil {
				return err
			}
			words[i] = v
		}
	}
	dest := words[len(words)-1]
	if dest == "" {
		return lineErr("%s: empty destination", ins)
	}
	for _, src := range words[:len(words)-1] {
		if src == "" {
			return lineErr("%s: empty source", ins)
		}
		if ins == "ADD" && (strings.HasPrefix(src, "http://") || strings.HasPrefix(src, "https://") || strings.HasPrefix(src, "git@")) {
			return lineErr("ADD of a URL (%s) is not supported: download it in a RUN step", src)
		}
		p.step("COPY", src, dest, user, mode)
	}
	return nil
}

// validVarName: what an environment variable's name cannot be (the
// builder refuses the same).
func validVarName(k string) bool {
	return k != "" && !strings.ContainsAny(k, "=\x00")
}

// runCommand is the shell command of a RUN instruction.
func runCommand(n *parser.Node) (string, error) {
	if n.Attributes["json"] {
		return quoteWords(args(n)), nil
	}
	cmd := ""
	if n.Next != nil {
		cmd = n.Next.Value
	}
	if len(n.Heredocs) == 0 {
		return cmd, nil
	}
	// RUN <<EOF alone: the heredoc is the script.
	if len(n.Heredocs) == 1 {
		if h, _ := parser.ParseHeredoc(strings.TrimSpace(cmd)); h != nil && h.Name == n.Heredocs[0].Name {
			script := n.Heredocs[0].Content
			if h.Chomp {
				script = parser.ChompHeredocContent(script)
			}
			if strings.HasPrefix(script, "#!") {
				return "", errors.New("RUN heredoc with a #! interpreter line is not supported")
			}
			return script, nil
		}
	}
	// Otherwise the heredocs feed the command: the shell does that itself.
	var b strings.Builder
	b.WriteString(cmd)
	b.WriteByte('\n')
	for _, h := range n.Heredocs {
		b.WriteString(h.Content)
		if h.Content != "" && !strings.HasSuffix(h.Content, "\n") {
			b.WriteByte('\n')
		}
		b.WriteString(h.Name)
		b.WriteByte('\n')
	}
	return b.String(), nil
}

// commandLine is a CMD or ENTRYPOINT as one shell command.
func commandLine(n *parser.Node) string {
	if n.Attributes["json"] {
		return quoteWords(args(n))
	}
	if n.Next == nil {
		return ""
	}
	return n.Next.Value
}

// quoteWords joins words into a shell command that gives them back.
func quoteWords(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = shellQuote(w)
	}
	return strings.Join(q, " ")
}

func shellQuote(s string) string {
	if s == "" {
		return "''"
	}
	safe := true
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-./:=@%+,", r)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
