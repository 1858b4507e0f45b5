package setup

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/baseimage"
	"github.com/warren-sandbox/warren/internal/image"
)

// A background build explains itself to creates while it runs and after
// it failed, and not once it is done; a cancelled one has ended (its
// cleanup done) when Wait returns.
func TestBackgroundBuildStates(t *testing.T) {
	s, err := image.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ci := baseimage.CodeInterpreterID
	for _, tc := range []struct {
		name    string
		result  error
		state   BuildState
		pending string
	}{
		{"ready", nil, BuildReady, ""},
		{"failed", errors.New("apt-get: no mirror\nmore output"), BuildFailed, "build on this node failed (apt-get: no mirror); the next start"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			b := newBackground(s, nil, func(ctx context.Context, _ *image.Store, progress *logWriter) error {
				progress.Write([]byte("[" + ci + "    0.1s] apt-get install\nsome output"))
				<-release
				return tc.result
			})
			if got := b.Pending(ci); got != "" {
				t.Errorf("before Start: %q", got)
			}
			b.Start(context.Background())
			if st, _, _ := b.State(); st != BuildBuilding {
				t.Errorf("state %q, want building", st)
			}
			if got := b.Pending(ci); !strings.Contains(got, "is being built on this node") {
				t.Errorf("while building: %q", got)
			}
			if got := b.Pending(baseimage.TemplateID); got != "" {
				t.Errorf("base is not this build's: %q", got)
			}
			close(release)
			b.Wait()
			if st, _, _ := b.State(); st != tc.state {
				t.Errorf("state %q, want %q", st, tc.state)
			}
			got := b.Pending(ci)
			if (tc.pending == "") != (got == "") || !strings.Contains(got, tc.pending) {
				t.Errorf("after: %q, want %q", got, tc.pending)
			}
		})
	}
	t.Run("cancelled", func(t *testing.T) {
		cleaned := false
		b := newBackground(s, nil, func(ctx context.Context, _ *image.Store, _ *logWriter) error {
			<-ctx.Done()
			cleaned = true
			return ctx.Err()
		})
		ctx, cancel := context.WithCancel(context.Background())
		b.Start(ctx)
		cancel()
		b.Wait()
		if !cleaned {
			t.Error("Wait returned before the build ended")
		}
	})
	t.Run("never started", func(t *testing.T) {
		newBackground(s, nil, nil).Wait() // returns at once
	})
}
