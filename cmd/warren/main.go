// Command warren is the Warren platform: API, sandbox manager, template
// builder, proxy and CLI, in one binary.
package main

import (
	"fmt"
	"os"
)

const usage = `usage: warren <command> [flags]

commands:
  version   print the version
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	switch os.Args[1] {
	case "version":
		fmt.Println("warren (development)")
	default:
		fmt.Fprintf(os.Stderr, "warren: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
}
