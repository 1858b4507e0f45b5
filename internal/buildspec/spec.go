// Package buildspec is what a template build is made of: a base, steps
// in order, the start and ready commands, and the registry credentials
// for the base image. It is the E2B SDK's TemplateBuildStartV2 body, the
// API server's input and the CLI client's output (a Dockerfile becomes
// one, see internal/dockerfile), so it imports nothing of Warren's: the
// client uses it without the server.
//
// Validate checks a spec's form; the builder (internal/template) checks
// the rest, which needs the server (that COPY files were uploaded).
package buildspec

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// ErrInvalid is wrapped by the errors of specs that are malformed; the
// builder's own ErrInvalid is this one, which the API maps to 400.
var ErrInvalid = errors.New("invalid request")

// Spec is what a build makes: a base, steps in order, and the start and
// ready commands. It is the SDK's TemplateBuildStartV2 body; a Dockerfile
// is translated into one (internal/dockerfile).
type Spec struct {
	// Exactly one of FromImage and FromTemplate is set.
	FromImage         string        `json:"fromImage,omitempty"`
	FromTemplate      string        `json:"fromTemplate,omitempty"`
	FromImageRegistry *RegistryAuth `json:"fromImageRegistry,omitempty"`
	StartCmd          string        `json:"startCmd,omitempty"`
	ReadyCmd          string        `json:"readyCmd,omitempty"`
	// Force skips the layer cache for every step.
	Force bool   `json:"force,omitempty"`
	Steps []Step `json:"steps"`
}

// Step is one build step. Types and their Args:
//
//	COPY     [src, dest, user, mode]  src is a glob within the archive
//	         uploaded under FilesHash; user "" is the current user; mode
//	         "" keeps the files' modes, else octal like "0755".
//	RUN      [command] or [command, user]
//	WORKDIR  [path]
//	USER     [name]
//	ENV      [k1, v1, k2, v2, ...]
type Step struct {
	Type      string   `json:"type"`
	Args      []string `json:"args,omitempty"`
	FilesHash string   `json:"filesHash,omitempty"`
	// Force skips the layer cache for this step.
	Force bool `json:"force,omitempty"`
}

// RegistryAuth are the credentials for pulling FromImage.
type RegistryAuth struct {
	// Type is "registry" (Username, Password), "aws" or "gcp".
	Type               string `json:"type"`
	Username           string `json:"username,omitempty"`
	Password           string `json:"password,omitempty"`
	AwsAccessKeyID     string `json:"awsAccessKeyId,omitempty"`
	AwsSecretAccessKey string `json:"awsSecretAccessKey,omitempty"`
	AwsRegion          string `json:"awsRegion,omitempty"`
	ServiceAccountJSON string `json:"serviceAccountJson,omitempty"`
}

// filesHashPattern is the form of a COPY step's FilesHash: the client's
// name for the uploaded archive, which becomes a file name on the server.
var filesHashPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// ValidFilesHash tells whether h may name a COPY step's uploaded files.
func ValidFilesHash(h string) bool { return filesHashPattern.MatchString(h) }

// Validate checks a spec's form: what can be checked without the server
// (the files of COPY steps are the builder's to find).
func (s *Spec) Validate() error {
	if s.FromImage != "" && s.FromTemplate != "" {
		return fmt.Errorf("%w: give fromImage or fromTemplate, not both", ErrInvalid)
	}
	if s.FromImage == "" && s.FromTemplate == "" {
		return fmt.Errorf("%w: fromImage or fromTemplate is required", ErrInvalid)
	}
	if s.ReadyCmd != "" && s.StartCmd == "" {
		return fmt.Errorf("%w: readyCmd needs a startCmd", ErrInvalid)
	}
	for i, st := range s.Steps {
		n := i + 1
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%w: step %d (%s): %s", ErrInvalid, n, st.Type, fmt.Sprintf(format, args...))
		}
		switch st.Type {
		case "RUN":
			if len(st.Args) < 1 || len(st.Args) > 2 || strings.TrimSpace(st.Args[0]) == "" {
				return bad("args are [command] or [command, user]")
			}
		case "COPY":
			if len(st.Args) < 2 || len(st.Args) > 4 || st.Args[0] == "" || st.Args[1] == "" {
				return bad("args are [src, dest, user, mode]")
			}
			if len(st.Args) == 4 && st.Args[3] != "" {
				if _, err := strconv.ParseUint(st.Args[3], 8, 32); err != nil {
					return bad("mode %q is not octal", st.Args[3])
				}
			}
			if st.FilesHash == "" || !ValidFilesHash(st.FilesHash) {
				return bad("filesHash is required")
			}
		case "WORKDIR", "USER":
			if len(st.Args) != 1 || st.Args[0] == "" {
				return bad("args are [value]")
			}
		case "ENV":
			if len(st.Args)%2 != 0 {
				return bad("args are key, value pairs")
			}
			for j := 0; j < len(st.Args); j += 2 {
				if st.Args[j] == "" || strings.ContainsAny(st.Args[j], "=\x00") {
					return bad("invalid variable name %q", st.Args[j])
				}
			}
		default:
			return fmt.Errorf("%w: step %d: unknown type %q (COPY, RUN, WORKDIR, USER or ENV)", ErrInvalid, n, st.Type)
		}
	}
	return nil
}
