package s3test

import (
	"os"
	"strings"
	"testing"
)

// install-deps.sh builds the version the tests look for.
func TestInstallDepsBuildsThisVersion(t *testing.T) {
	b, err := os.ReadFile("../../../scripts/install-deps.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "weed_version="+WeedVersion+"\n") {
		t.Fatalf("scripts/install-deps.sh does not build SeaweedFS %s", WeedVersion)
	}
}
