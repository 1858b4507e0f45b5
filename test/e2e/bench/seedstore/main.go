// Command seedstore adds sandbox records to a Warren store, for the list
// benchmark: N running sandboxes of the default team, placed on a node
// named "elsewhere", so that the server under test lists them but never
// adopts or reaps them.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"time"

	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/envdinfo"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
)

func main() {
	url := flag.String("store", "", "store URL or SQLite file")
	n := flag.Int("n", 1000, "records to add")
	flag.Parse()
	ctx := context.Background()
	st, err := store.Open(ctx, *url)
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	now := time.Now()
	for i := 0; i < *n; i++ {
		err := st.CreateSandbox(ctx, store.Sandbox{
			ID: sandbox.NewID(), TeamID: auth.DefaultTeamID, TemplateID: "base", Alias: "base", State: store.StateRunning,
			StartedAt: now.Add(-time.Duration(i) * time.Second), EndAt: now.Add(24 * time.Hour),
			CPUCount: 2, MemoryMB: 512, DiskSizeMB: 1024, EnvdVersion: envdinfo.Version,
			Metadata: map[string]string{"seeded": "true", "i": fmt.Sprint(i)},
			Node:     "elsewhere", Runtime: "runsc", Extra: "{}",
		})
		if err != nil {
			log.Fatal(err)
		}
	}
}
