//go:build warren_faults

package sandbox

import (
	"context"
	"os"
	"slices"
	"strings"

	"github.com/warren-sandbox/warren/internal/blobstore"
)

// The fault points of a test build (go build -tags warren_faults): the
// environment variable WARREN_TEST_FAULT=step:id[,step:id…] (id * for
// any sandbox) makes the process exit with status 137, at once and
// without cleaning up, as a kill -9 would leave it, when sandbox id
// reaches step:
//
//	pause-before-upload    the pause's pack is written, nothing sent
//	pause-mid-upload       some of the upload's parts are stored, not all
//	pause-after-upload     the blob is stored, the record does not name it
//	resume-after-download  a takeover fetched the blob, not unpacked it
//	resume-after-claim     a takeover unpacked it and the record names
//	                       this node; the sandbox is still paused
//	resume-before-restore  the record says running (with its slot), the
//	                       runtime has not started it
//	resume-after-restore   the runtime restored it (from its checkpoint)
//	                       and envd answers; the record still names its
//	                       paused files

func (m *Manager) faultPoint(step, id string) {
	faults := strings.Split(os.Getenv("WARREN_TEST_FAULT"), ",")
	if slices.Contains(faults, step+":"+id) || slices.Contains(faults, step+":*") {
		m.log.Error("test fault point: exiting", "step", step, "sandbox", id)
		os.Exit(137)
	}
}

func (m *Manager) uploadFaults(ctx context.Context, id string) context.Context {
	return blobstore.WithProgress(ctx, func(p blobstore.Progress) {
		if p.Parts-p.Reused >= 1 && p.Parts < p.Total {
			m.faultPoint("pause-mid-upload", id)
		}
	})
}

const faultsBuilt = true
