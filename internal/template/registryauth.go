package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/warren-sandbox/warren/internal/buildspec"
	"github.com/warren-sandbox/warren/internal/store"
)

// Registry credentials of a build (a password, AWS keys, a GCP service
// account's JSON key) are sealed before the build's spec is stored, under
// the server's key (Config.Sealer, secret.Sealer: the node key, or the
// cluster's) and bound to the team and the build, so that a sealed value
// moved to another build does not open. The stored spec keeps only the
// credentials' type. They are opened by the build's pull (fromImage),
// and no answer or log line carries them.

func registryAuthContext(teamID, buildID string) string {
	return "registry-auth/" + teamID + "/" + buildID
}

// sealRegistryAuth seals spec's registry credentials for build buildID
// of team teamID and leaves only their type in spec.
func (b *Builder) sealRegistryAuth(teamID, buildID string, spec *buildspec.Spec) (string, error) {
	a := spec.FromImageRegistry
	if a == nil {
		return "", nil
	}
	if b.cfg.Sealer == nil {
		return "", fmt.Errorf("%w: this server cannot keep registry credentials", ErrInvalid)
	}
	raw, err := json.Marshal(a)
	if err != nil {
		return "", err
	}
	sealed, err := b.cfg.Sealer.Seal(string(raw), registryAuthContext(teamID, buildID))
	if err != nil {
		return "", fmt.Errorf("sealing the registry credentials: %w", err)
	}
	spec.FromImageRegistry = &buildspec.RegistryAuth{Type: a.Type}
	return sealed, nil
}

// openRegistryAuth opens what sealRegistryAuth sealed.
func (b *Builder) openRegistryAuth(teamID, buildID, sealed string) (*buildspec.RegistryAuth, error) {
	if sealed == "" {
		return nil, errors.New("the build's registry credentials are missing")
	}
	if b.cfg.Sealer == nil {
		return nil, errors.New("this server cannot open registry credentials")
	}
	raw, err := b.cfg.Sealer.Open(sealed, registryAuthContext(teamID, buildID))
	if err != nil {
		return nil, fmt.Errorf("opening the build's registry credentials: %w", err)
	}
	var a buildspec.RegistryAuth
	if err := json.Unmarshal([]byte(raw), &a); err != nil {
		return nil, fmt.Errorf("the build's registry credentials: %w", err)
	}
	return &a, nil
}

// scrubRegistryAuth removes the registry credentials that builds started
// before they were sealed keep in clear: those builds have ended (a
// restart ends the running ones), so only the credentials' type is kept.
func (b *Builder) scrubRegistryAuth(ctx context.Context) error {
	builds, err := b.cfg.Store.BuildsByStatus(ctx, store.BuildReady, store.BuildError)
	if err != nil {
		return err
	}
	for _, bd := range builds {
		if !clearRegistryAuth(readRecord(bd)) {
			continue
		}
		if _, err := b.cfg.Store.UpdateBuild(ctx, bd.ID, func(x *store.Build) error {
			rec := readRecord(*x)
			if clearRegistryAuth(rec) {
				rec.Spec.FromImageRegistry = &buildspec.RegistryAuth{Type: rec.Spec.FromImageRegistry.Type}
				x.Spec = rec.String()
			}
			return nil
		}); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		b.log.Info("removed registry credentials kept in clear by an old build", "build", bd.ID)
	}
	return nil
}

// clearRegistryAuth tells whether rec holds registry credentials in clear.
func clearRegistryAuth(rec buildRecord) bool {
	if rec.Spec == nil || rec.Spec.FromImageRegistry == nil {
		return false
	}
	a := rec.Spec.FromImageRegistry
	return a.Username != "" || a.Password != "" || a.AwsAccessKeyID != "" || a.AwsSecretAccessKey != "" ||
		a.AwsRegion != "" || a.ServiceAccountJSON != ""
}
