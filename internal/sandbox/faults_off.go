//go:build !warren_faults

package sandbox

import "context"

// Fault points are steps of a pause or resume at which a test build of
// Warren (built with -tags warren_faults: faults_on.go) exits as a
// kill -9 would, to show that a crash there loses nothing. In this, the
// production build, they do nothing, and no environment changes that.

// faultPoint is the step named step of sandbox id's pause or resume.
func (m *Manager) faultPoint(step, id string) {}

// uploadFaults returns ctx for sandbox id's upload to the blob store.
func (m *Manager) uploadFaults(ctx context.Context, id string) context.Context { return ctx }

// faultsBuilt reports a build with the fault points.
const faultsBuilt = false
