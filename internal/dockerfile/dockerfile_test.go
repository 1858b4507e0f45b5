package dockerfile

import (
	"reflect"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/buildspec"
)

func st(typ string, args ...string) buildspec.Step { return buildspec.Step{Type: typ, Args: args} }

// wrap adds the steps Parse puts around a Dockerfile's own.
func wrap(steps ...buildspec.Step) []buildspec.Step {
	out := []buildspec.Step{st("USER", "root"), st("WORKDIR", "/")}
	out = append(out, steps...)
	return append(out, st("USER", "user"), st("WORKDIR", "/home/user"))
}

func TestParseDockerfile(t *testing.T) {
	tests := []struct {
		name string
		text string
		want buildspec.Spec
	}{
		{
			name: "minimal",
			text: "FROM ubuntu:22.04\n",
			want: buildspec.Spec{FromImage: "ubuntu:22.04", Steps: wrap()},
		},
		{
			name: "from with platform and stage name",
			text: "FROM --platform=linux/amd64 python:3.12-slim AS app\n",
			want: buildspec.Spec{FromImage: "python:3.12-slim", Steps: wrap()},
		},
		{
			name: "global ARG in FROM",
			text: "ARG VERSION=3.12\nFROM python:${VERSION}\nARG VERSION\nRUN echo $VERSION\n",
			want: buildspec.Spec{FromImage: "python:3.12", Steps: wrap(
				st("ENV", "VERSION", "3.12"),
				st("RUN", "echo $VERSION"),
			)},
		},
		{
			name: "lowercase, comments, continuations, directives",
			text: "# syntax=docker/dockerfile:1\n# a comment\nfrom alpine\nrun apk add \\\n    curl \\\n    # inner comment\n    git\n",
			want: buildspec.Spec{FromImage: "alpine", Steps: wrap(st("RUN", "apk add     curl     git"))},
		},
		{
			name: "escape directive",
			text: "# escape=`\nFROM alpine\nRUN echo a `\n  b\n",
			want: buildspec.Spec{FromImage: "alpine", Steps: wrap(st("RUN", "echo a   b"))},
		},
		{
			name: "run shell and exec form",
			text: "FROM alpine\nRUN echo \"hello world\" && ls\nRUN [\"/bin/sh\", \"-c\", \"echo 'hi there'\"]\nRUN [\"ls\",\"-la\",\"\"]\n",
			want: buildspec.Spec{FromImage: "alpine", Steps: wrap(
				st("RUN", `echo "hello world" && ls`),
				st("RUN", `/bin/sh -c 'echo '\''hi there'\'''`),
				st("RUN", `ls -la ''`),
			)},
		},
		{
			name: "run cache mount ignored",
			text: "FROM python\nRUN --mount=type=cache,target=/root/.cache pip install x\n",
			want: buildspec.Spec{FromImage: "python", Steps: wrap(st("RUN", "pip install x"))},
		},
		{
			name: "run heredoc script",
			text: "FROM alpine\nRUN <<EOF\nset -e\necho hi\nEOF\nRUN <<-EOT\n\techo tabbed\n\tEOT\n",
			want: buildspec.Spec{FromImage: "alpine", Steps: wrap(
				st("RUN", "set -e\necho hi\n"),
				st("RUN", "echo tabbed\n"),
			)},
		},
		{
			name: "run heredoc feeding a command",
			text: "FROM alpine\nRUN cat <<'EOF' > /etc/motd\nhello $USER\nEOF\n",
			want: buildspec.Spec{FromImage: "alpine", Steps: wrap(
				st("RUN", "cat <<'EOF' > /etc/motd\nhello $USER\nEOF\n"),
			)},
		},
		{
			name: "copy and add",
			text: "FROM alpine\nCOPY app.py /app/\nCOPY --chown=app:app --chmod=755 a.sh b.sh /usr/local/bin/\nADD --chmod=0644 conf.tar /etc/\nCOPY --link [\"my file.txt\", \"/data/\"]\n",
			want: buildspec.Spec{FromImage: "alpine", Steps: wrap(
				st("COPY", "app.py", "/app/", "", ""),
				st("COPY", "a.sh", "/usr/local/bin/", "app", "0755"),
				st("COPY", "b.sh", "/usr/local/bin/", "app", "0755"),
				st("COPY", "conf.tar", "/etc/", "", "0644"),
				st("COPY", "my file.txt", "/data/", "", ""),
			)},
		},
		{
			name: "env forms",
			text: "FROM alpine\nENV A=1 B=\"two words\" C='$lit'\nENV LEGACY some value here\nENV PATH=/opt/bin:$PATH D=${A}x\n",
			want: buildspec.Spec{FromImage: "alpine", Steps: wrap(
				st("ENV", "A", "1", "B", "two words", "C", "$lit"),
				st("ENV", "LEGACY", "some value here"),
				st("ENV", "PATH", "/opt/bin:$PATH", "D", "1x"),
			)},
		},
		{
			name: "arg forms",
			text: "FROM alpine\nARG NAME=default\nARG EMPTY\nARG X=1 Y\nCOPY $NAME/ /srv/\n",
			want: buildspec.Spec{FromImage: "alpine", Steps: wrap(
				st("ENV", "NAME", "default"),
				st("ENV", "EMPTY", ""),
				st("ENV", "X", "1", "Y", ""),
				st("COPY", "default/", "/srv/", "", ""),
			)},
		},
		{
			name: "workdir and user set: no defaults appended",
			text: "FROM alpine\nWORKDIR /app\nUSER app:staff\n",
			want: buildspec.Spec{FromImage: "alpine", Steps: []buildspec.Step{
				st("USER", "root"), st("WORKDIR", "/"),
				st("WORKDIR", "/app"), st("USER", "app"),
			}},
		},
		{
			name: "only user set",
			text: "FROM alpine\nUSER nobody\n",
			want: buildspec.Spec{FromImage: "alpine", Steps: []buildspec.Step{
				st("USER", "root"), st("WORKDIR", "/"),
				st("USER", "nobody"), st("WORKDIR", "/home/user"),
			}},
		},
		{
			name: "cmd shell form",
			text: "FROM alpine\nCMD python -m http.server 8000\n",
			want: buildspec.Spec{FromImage: "alpine", StartCmd: "python -m http.server 8000", ReadyCmd: "sleep 20", Steps: wrap()},
		},
		{
			name: "cmd exec form, last wins",
			text: "FROM alpine\nCMD [\"first\"]\nCMD [\"node\", \"server.js\", \"--name\", \"my app\"]\n",
			want: buildspec.Spec{FromImage: "alpine", StartCmd: "node server.js --name 'my app'", ReadyCmd: "sleep 20", Steps: wrap()},
		},
		{
			name: "entrypoint then cmd",
			text: "FROM alpine\nCMD [\"--port\", \"80\"]\nENTRYPOINT [\"/entry.sh\"]\n",
			want: buildspec.Spec{FromImage: "alpine", StartCmd: "/entry.sh --port 80", ReadyCmd: "sleep 20", Steps: wrap()},
		},
		{
			name: "shell entrypoint ignores cmd",
			text: "FROM alpine\nENTRYPOINT exec /entry.sh\nCMD [\"x\"]\n",
			want: buildspec.Spec{FromImage: "alpine", StartCmd: "exec /entry.sh", ReadyCmd: "sleep 20", Steps: wrap()},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.text)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got\n  %+v\nwant\n  %+v", got, tt.want)
			}
		})
	}
}

func TestParseDockerfileErrors(t *testing.T) {
	tests := []struct {
		name, text, want string
	}{
		{"empty", "# nothing\n", "line"},
		{"no from", "ARG X=1\n", "must contain a FROM"},
		{"before from", "RUN echo\nFROM alpine\n", "line 1: RUN before FROM"},
		{"multi-stage", "FROM golang AS build\nRUN go build\nFROM alpine\n", "multi-stage Dockerfiles are not supported (line 3)"},
		{"copy from", "FROM alpine\nCOPY --from=build /app /app\n", "line 2: COPY --from is not supported"},
		{"add url", "FROM alpine\n\nADD https://example.com/x.tgz /tmp/\n", "line 3: ADD of a URL"},
		{"add git", "FROM alpine\nADD git@github.com:a/b.git /src\n", "line 2: ADD of a URL"},
		{"expose", "FROM alpine\nEXPOSE 80\n", "unsupported Dockerfile instruction EXPOSE on line 2"},
		{"label", "FROM alpine\nLABEL a=b\n", "unsupported Dockerfile instruction LABEL on line 2"},
		{"volume", "FROM alpine\nVOLUME /data\n", "unsupported Dockerfile instruction VOLUME on line 2"},
		{"healthcheck", "FROM alpine\nHEALTHCHECK --interval=5s CMD true\n", "unsupported Dockerfile instruction HEALTHCHECK on line 2"},
		{"shell", "FROM alpine\nSHELL [\"/bin/bash\", \"-c\"]\n", "unsupported Dockerfile instruction SHELL on line 2"},
		{"onbuild", "FROM alpine\nONBUILD RUN x\n", "unsupported Dockerfile instruction ONBUILD on line 2"},
		{"stopsignal", "FROM alpine\nSTOPSIGNAL SIGTERM\n", "unsupported Dockerfile instruction STOPSIGNAL on line 2"},
		{"maintainer", "FROM alpine\nMAINTAINER me\n", "unsupported Dockerfile instruction MAINTAINER on line 2"},
		{"unknown", "FROM alpine\nFROB x\n", "unsupported Dockerfile instruction FROB on line 2"},
		{"copy heredoc", "FROM alpine\nCOPY <<EOF /f\nx\nEOF\n", "line 2: COPY with a heredoc"},
		{"heredoc shebang", "FROM alpine\nRUN <<EOF\n#!/usr/bin/env python3\nprint(1)\nEOF\n", "line 2: RUN heredoc with a #!"},
		{"unterminated heredoc", "FROM alpine\nRUN <<EOF\necho\n", "line 2"},
		{"run secret mount", "FROM alpine\nRUN --mount=type=secret,id=x cat /run/secrets/x\n", "line 2: RUN: unsupported flag --mount=type=secret"},
		{"symbolic chmod", "FROM alpine\nCOPY --chmod=u+x a /a\n", "line 2: COPY: --chmod=u+x"},
		{"copy one arg", "FROM alpine\nCOPY a\n", "line 2: COPY requires"},
		{"copy exclude", "FROM alpine\nCOPY --exclude=*.md . /app\n", "line 2: COPY: unsupported flag --exclude"},
		{"empty env", "FROM alpine\nENV\n", "line 2"},
		{"empty workdir", "FROM alpine\nWORKDIR \"\"\n", "line 2: WORKDIR: empty path"},
		{"bad substitution", "FROM alpine\nWORKDIR ${\n", "line 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse(tt.text)
			if err == nil {
				t.Fatalf("no error; spec %+v", s)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
			if testing.Verbose() {
				t.Log(err)
			}
		})
	}
}

// FuzzParseDockerfile: no Dockerfile makes the translation panic, and
// every spec it returns is one the builder accepts (once the client has
// filled in the COPY steps' hashes, as `warren template build` does).
func FuzzParseDockerfile(f *testing.F) {
	for _, seed := range []string{
		"FROM ubuntu:22.04\n",
		"ARG VERSION=3.12\nFROM python:${VERSION}\nARG VERSION\nRUN echo $VERSION\n",
		"# escape=`\nFROM alpine\nRUN echo a `\n  b\n",
		"FROM alpine\nRUN [\"/bin/sh\", \"-c\", \"echo 'hi there'\"]\nRUN [\"ls\",\"\"]\n",
		"FROM python\nRUN --mount=type=cache,target=/root/.cache pip install x\n",
		"FROM alpine\nRUN <<EOF\nset -e\necho hi\nEOF\nRUN <<-EOT\n\techo tabbed\n\tEOT\n",
		"FROM alpine\nRUN cat <<'EOF' > /etc/motd\nhello $USER\nEOF\n",
		"FROM alpine\nCOPY --chown=app:app --chmod=755 a.sh b.sh /usr/local/bin/\nADD --chmod=0644 conf.tar /etc/\nCOPY --link [\"my file.txt\", \"/data/\"]\n",
		"FROM alpine\nENV A=1 B=\"two words\" C='$lit'\nENV LEGACY some value here\nENV PATH=/opt/bin:$PATH D=${A}x\n",
		"FROM alpine\nARG NAME=default\nARG EMPTY\nARG X=1 Y\nCOPY $NAME/ /srv/\n",
		"FROM alpine\nWORKDIR /app\nUSER app:staff\nWORKDIR rel\n",
		"FROM alpine\nCMD [\"--port\", \"80\"]\nENTRYPOINT [\"/entry.sh\"]\n",
		"FROM alpine\nENTRYPOINT exec /entry.sh\nCMD [\"x\"]\n",
		"FROM alpine\nENV A=\nENV =x\n",
		"FROM alpine\nUSER :group\n",
		"FROM alpine\nRUN <<EOF\n \nEOF\n",
		"FROM alpine\nRUN [\"\"]\n",
		"FROM alpine\nENV ${X}=1\n",
		"FROM alpine\nARG A\\=B=1\n",
		"FROM alpine\nCOPY \"\" /x\n",
		"FROM alpine\nWORKDIR ${UNSET}\n",
		"FROM $X\n",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		spec, err := Parse(text)
		if err != nil {
			return
		}
		for i := range spec.Steps {
			if spec.Steps[i].Type == "COPY" {
				spec.Steps[i].FilesHash = "0123456789abcdef"
			}
		}
		if err := spec.Validate(); err != nil {
			t.Fatalf("Parse(%q) gave a spec the builder refuses: %v\n%+v", text, err, spec)
		}
	})
}
