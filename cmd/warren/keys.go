package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/server"
	"github.com/warren-sandbox/warren/internal/setup"
	"github.com/warren-sandbox/warren/internal/store"
)

const keysUsage = `usage: warren keys create [--access-token] [--name NAME]
       warren keys list
       warren keys revoke ID
flags (all, before ID): --data-dir DIR, --store URL (default: DIR/warren.db),
  --team ID (default: the first team; create makes the team if it is new)`

// keysArgs is how many arguments each command takes after its flags.
var keysArgs = map[string]int{"create": 0, "list": 0, "revoke": 1}

func runKeys(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New(keysUsage)
	}
	fs := flag.NewFlagSet("keys", flag.ExitOnError)
	dataDir := fs.String("data-dir", setup.DefaultDataDir, "where Warren keeps its state")
	storeURL := fs.String("store", "", "PostgreSQL URL, or a SQLite file (default: DATA-DIR/warren.db)")
	accessToken := fs.Bool("access-token", false, "create an access token (Bearer) instead of an API key")
	name := fs.String("name", "", "a name to recognise the key by")
	teamID := fs.String("team", auth.DefaultTeamID, "the team whose keys these are; create makes it if it is new")
	fs.Parse(args[1:])
	if !validTeamID(*teamID) {
		return fmt.Errorf("--team %q: want 1 to 64 of a-z, 0-9 and -", *teamID)
	}
	// Check the arguments before opening a store: a flag after an
	// argument is left unread (`revoke ID --data-dir DIR`), and the
	// default data dir's store must not be opened, or made, instead.
	if want, ok := keysArgs[args[0]]; !ok || fs.NArg() != want {
		return errors.New(keysUsage)
	}
	s, err := server.OpenStore(ctx, *dataDir, *storeURL)
	if err != nil {
		return err
	}
	defer s.Close()
	if first, err := auth.Bootstrap(ctx, s, *dataDir, "", ""); err != nil {
		return err
	} else if first != nil {
		fmt.Printf("first use of %s: the initial API key and access token are in %s\n", *dataDir, first.File)
	}
	switch args[0] {
	case "create":
		kind := store.KindAPIKey
		if *accessToken {
			kind = store.KindAccessToken
		}
		if err := ensureTeam(ctx, s, *teamID); err != nil {
			return err
		}
		k, secret, err := auth.CreateKey(ctx, s, *teamID, kind, *name, "")
		if err != nil {
			return err
		}
		fmt.Printf("%s %s created (id %s); it is shown only now:\n%s\n", kind, k.Mask, k.ID, secret)
	case "list":
		keys, err := s.ListKeys(ctx, *teamID)
		if err != nil {
			return err
		}
		w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tKIND\tKEY\tNAME\tCREATED")
		for _, k := range keys {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", k.ID, k.Kind, k.Mask, k.Name, k.CreatedAt.Format("2006-01-02 15:04"))
		}
		return w.Flush()
	case "revoke":
		if fs.NArg() != 1 {
			return errors.New(keysUsage)
		}
		if err := s.DeleteKey(ctx, *teamID, fs.Arg(0)); err != nil {
			return err
		}
		fmt.Println("revoked", fs.Arg(0))
	default:
		return errors.New(keysUsage)
	}
	return nil
}

// validTeamID tells whether id is a team ID an operator may name: the
// default team's or 1 to 64 of a-z, 0-9 and -.
func validTeamID(id string) bool {
	if id == auth.DefaultTeamID {
		return true
	}
	if id == "" || len(id) > 64 {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}

// ensureTeam makes team id (named as its ID) unless it exists: Warren
// has no other way to add a team.
func ensureTeam(ctx context.Context, s store.Store, id string) error {
	if _, err := s.GetTeam(ctx, id); err == nil {
		return nil
	} else if !errors.Is(err, store.ErrNotFound) {
		return err
	}
	err := s.CreateTeam(ctx, store.Team{ID: id, Name: id, CreatedAt: time.Now()})
	if errors.Is(err, store.ErrConflict) {
		return nil // made meanwhile
	}
	return err
}
