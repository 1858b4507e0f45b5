package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/warren-sandbox/warren/internal/cluster"
	"github.com/warren-sandbox/warren/internal/server"
	"github.com/warren-sandbox/warren/internal/setup"
	"github.com/warren-sandbox/warren/internal/store"
)

const nodesUsage = `usage: warren nodes [list]
       warren nodes cordon|uncordon NAME
       warren nodes drain NAME [--timeout DUR]
flags (all): --data-dir DIR, --store URL (default: DIR/warren.db), --lost-after DUR`

func runNodes(ctx context.Context, args []string) error {
	sub := "list"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("nodes", flag.ExitOnError)
	dataDir := fs.String("data-dir", setup.DefaultDataDir, "where Warren keeps its state")
	storeURL := fs.String("store", "", "PostgreSQL URL, or a SQLite file (default: DATA-DIR/warren.db)")
	lostAfter := fs.Duration("lost-after", cluster.DefaultLostAfter, "a node not heard from for this long is lost")
	timeout := fs.Duration("timeout", 10*time.Minute, "drain: how long to wait for the node's sandboxes to be paused")
	// Flags may come before or after NAME.
	var positional []string
	for fs.Parse(args); fs.NArg() > 0; fs.Parse(args) {
		positional, args = append(positional, fs.Arg(0)), fs.Args()[1:]
	}
	name := ""
	if len(positional) > 0 {
		name = positional[0]
	}
	if (sub == "list") != (name == "") || len(positional) > 1 {
		return errors.New(nodesUsage)
	}
	s, err := server.OpenStore(ctx, *dataDir, *storeURL)
	if err != nil {
		return err
	}
	defer s.Close()
	switch sub {
	case "list":
		nodes, err := s.ListNodes(ctx)
		if err != nil {
			return err
		}
		return printNodes(os.Stdout, nodes, time.Now(), *lostAfter)
	case "cordon", "uncordon", "drain":
		state := map[string]store.NodeState{"cordon": store.NodeCordoned, "uncordon": store.NodeReady, "drain": store.NodeDraining}[sub]
		if err := s.SetNodeState(ctx, name, state); err != nil {
			return err
		}
		fmt.Printf("node %s is %s\n", name, state)
		if sub != "drain" {
			return nil
		}
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		err := cluster.WaitDrained(ctx, s, name, *lostAfter, func(n store.Node) {
			fmt.Printf("node %s: %d sandboxes running\n", n.Name, n.Sandboxes)
		})
		if err != nil {
			return fmt.Errorf("draining node %s: %w", name, err)
		}
		fmt.Printf("node %s is drained: its sandboxes are paused\n", name)
		return nil
	}
	return errors.New(nodesUsage)
}

// printNodes writes the node list: a header line, then one line per node
// starting NAME STATE SANDBOXES (scripts rely on those three columns).
func printNodes(out io.Writer, nodes []store.Node, now time.Time, lostAfter time.Duration) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tSTATE\tSANDBOXES\tADDRESS\tRUNTIME\tFREE_CPU\tFREE_MEMORY_MB\tFREE_DISK_MB\tLABELS\tHEARTBEAT")
	for _, n := range nodes {
		addr, labels := n.Address, "-"
		if addr == "" {
			addr = "-"
		}
		if len(n.Labels) > 0 {
			var l []string
			for k, v := range n.Labels {
				l = append(l, k+"="+v)
			}
			slices.Sort(l)
			labels = strings.Join(l, ",")
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", n.Name, cluster.StateOf(n, now, lostAfter), n.Sandboxes, addr, n.Runtime,
			n.CPUs-n.UsedCPUs, n.MemoryMB-n.UsedMemoryMB, n.FreeDiskMB, labels, now.Sub(n.HeartbeatAt).Round(time.Second).String()+" ago")
	}
	return w.Flush()
}
