package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/setup"
	"github.com/warren-sandbox/warren/internal/templateclient"
)

const templateUsage = `usage: warren template build --name NAME[:TAG] [-f DOCKERFILE] [--cpu N] [--memory MB]
                            [--force] [--api-url URL] [--api-key KEY] [--data-dir DIR] [DIR]
Builds DIR (default .) and its Dockerfile into a template, through the
platform API, as the E2B SDK's Template.build does.`

func runTemplate(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "build" {
		return errors.New(templateUsage)
	}
	fs := flag.NewFlagSet("template build", flag.ExitOnError)
	fs.Usage = func() { fmt.Fprintln(os.Stderr, templateUsage); fs.PrintDefaults() }
	dockerfile := fs.String("f", "", "the Dockerfile (default: DIR/Dockerfile)")
	name := fs.String("name", "", "the template's name, optionally with a tag: NAME[:TAG]")
	cpu := fs.Int("cpu", 0, "CPU count of the template's sandboxes (0: the server's default)")
	memory := fs.Int("memory", 0, "memory of the template's sandboxes in MiB (0: the server's default)")
	force := fs.Bool("force", false, "skip the build cache")
	apiURL := fs.String("api-url", "", "the platform API (default: $E2B_API_URL, else http://127.0.0.1:3000)")
	apiKey := fs.String("api-key", "", "API key (default: $E2B_API_KEY, else the one in DATA-DIR/credentials)")
	dataDir := fs.String("data-dir", setup.DefaultDataDir, "where warren serve keeps its state (for the API key)")
	// Flags may come after DIR too.
	var dirs []string
	rest := args[1:]
	for {
		fs.Parse(rest)
		if fs.NArg() == 0 {
			break
		}
		dirs = append(dirs, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if len(dirs) > 1 {
		return fmt.Errorf("one context directory at most, got %q\n%s", dirs, templateUsage)
	}
	if *name == "" {
		return fmt.Errorf("--name is required\n%s", templateUsage)
	}
	dir := "."
	if len(dirs) == 1 {
		dir = dirs[0]
	}
	if *dockerfile == "" {
		*dockerfile = filepath.Join(dir, "Dockerfile")
	}
	text, err := os.ReadFile(*dockerfile)
	if err != nil {
		return err
	}
	if *apiURL == "" {
		*apiURL = os.Getenv("E2B_API_URL")
	}
	if *apiURL == "" {
		*apiURL = "http://127.0.0.1:3000"
	}
	key, err := templateAPIKey(*apiKey, *dataDir)
	if err != nil {
		return err
	}

	start := time.Now()
	elapsed := func() string { return fmt.Sprintf("[%6.1fs]", time.Since(start).Seconds()) }
	fmt.Printf("%s building %s from %s at %s\n", elapsed(), *name, *dockerfile, *apiURL)
	res, err := templateclient.New(*apiURL, key).Build(ctx, templateclient.BuildOptions{
		Name:       *name,
		Dockerfile: string(text),
		ContextDir: dir,
		CPUCount:   *cpu,
		MemoryMB:   *memory,
		Force:      *force,
		Progress:   func(e templateclient.Event) { fmt.Println(elapsed() + " " + formatEvent(e)) },
	})
	if err != nil {
		return err
	}
	fmt.Printf("template %s ready: templateID=%s buildID=%s in %.1fs\n", *name, res.TemplateID, res.BuildID, time.Since(start).Seconds())
	return nil
}

// formatEvent is a progress line without its time: "step 2  message",
// "step 3  warn  message", "status building".
func formatEvent(e templateclient.Event) string {
	if e.Message == "" {
		return "status " + e.Status
	}
	var b strings.Builder
	if e.Step != "" {
		step := e.Step
		if step != "base" && step != "finalize" {
			step = "step " + step
		}
		fmt.Fprintf(&b, "%-9s ", step)
	}
	if e.Level != "" && e.Level != "info" {
		b.WriteString(e.Level + "  ")
	}
	b.WriteString(strings.TrimRight(e.Message, "\n"))
	return b.String()
}

// templateAPIKey is --api-key, else $E2B_API_KEY, else the E2B_API_KEY
// line of the credentials file warren serve writes in its data directory.
func templateAPIKey(flagKey, dataDir string) (string, error) {
	if flagKey != "" {
		return flagKey, nil
	}
	if k := os.Getenv("E2B_API_KEY"); k != "" {
		return k, nil
	}
	file := filepath.Join(dataDir, "credentials")
	f, err := os.Open(file)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("no API key: pass --api-key or set E2B_API_KEY (%s does not exist)", file)
		}
		if errors.Is(err, fs.ErrPermission) {
			return "", fmt.Errorf("no API key: pass --api-key or set E2B_API_KEY (%s is readable by root only)", file)
		}
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "E2B_API_KEY="); ok && k != "" {
			return k, nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("no API key: pass --api-key or set E2B_API_KEY (none in %s)", file)
}
