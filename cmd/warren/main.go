// Command warren is the Warren platform: API, sandbox manager, template
// builder, proxy and CLI, in one binary.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/warren-sandbox/warren/internal/setup"
)

const usage = `usage: warren <command> [flags]

commands:
  setup     install the runtimes and the base template (idempotent)
  serve     run the platform: API, sandbox manager and sandbox proxy
  keys      manage API keys and access tokens: keys create|list|revoke
  nodes     list the nodes, or stop placement on one: nodes [list] | cordon|uncordon|drain NAME
  image     import an image archive (docker save, OCI layout tar): image import NAME ARCHIVE
  template  build a template from a Dockerfile: template build --name NAME[:TAG] [DIR]
  version   print the version
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "setup":
		err = runSetup(ctx, os.Args[2:])
	case "serve":
		err = runServe(ctx, os.Args[2:])
	case "keys":
		err = runKeys(ctx, os.Args[2:])
	case "nodes":
		err = runNodes(ctx, os.Args[2:])
	case "image":
		err = runImage(ctx, os.Args[2:])
	case "template":
		err = runTemplate(ctx, os.Args[2:])
	case "version":
		fmt.Println("warren (development)")
	default:
		fmt.Fprintf(os.Stderr, "warren: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "warren:", err)
		os.Exit(1)
	}
}

func runSetup(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("setup", flag.ExitOnError)
	dataDir := fs.String("data-dir", setup.DefaultDataDir, "where Warren keeps its state")
	mirror := fs.String("mirror", "", "Debian mirror for the base template (default: this machine's apt mirror)")
	runtimes := fs.String("runtimes", "runsc,runc", "runtimes to install, comma-separated")
	codeInterp := fs.Bool("code-interpreter", true, "also build the code-interpreter-v1 template (@e2b/code-interpreter's default) on top of base: Jupyter, numpy, pandas, matplotlib, scipy, scikit-learn, seaborn, TypeScript, R with IRkernel (about 235 MB from the mirror, 1.1 GB installed)")
	logFile := fs.String("log", "", "where the tools' raw output (debootstrap, apt, go build) goes: the terminal then shows only the steps, counts and, for a failed step, its last lines (default: setup.log in the data dir; - for the terminal)")
	fs.Parse(args)
	switch *logFile {
	case "":
		*logFile = filepath.Join(*dataDir, "setup.log")
	case "-":
		*logFile = ""
	}
	return setup.Run(ctx, setup.Options{DataDir: *dataDir, Mirror: *mirror, Runtimes: strings.Split(*runtimes, ","), CodeInterpreter: *codeInterp, LogFile: *logFile}, os.Stdout)
}
