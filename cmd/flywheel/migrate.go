package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flywheel-ai/flywheel/migrations"
	"github.com/flywheel-ai/flywheel/store"
)

func runMigrate(ctx context.Context, args []string) error {
	var to int64
	cfg, fs, err := loadConfig("migrate", args, func(fs *flag.FlagSet) {
		fs.Int64Var(&to, "to", -1, "with down: the version to roll back to (0 removes everything); required")
	})
	if err != nil {
		return err
	}
	action := "up"
	if fs.NArg() > 0 {
		action = fs.Arg(0)
	}
	db, err := migrations.Open(cfg.Database.URL)
	if err != nil {
		return err
	}
	defer db.Close()
	switch action {
	case "up":
		n, err := migrations.Up(ctx, db)
		if err != nil {
			return err
		}
		cur, _, err := migrations.Version(ctx, db)
		if err != nil {
			return err
		}
		fmt.Printf("applied %d migration(s); schema at version %d\n", n, cur)
	case "down":
		if to < 0 {
			return fmt.Errorf("migrate down needs --to VERSION (0 removes every table)")
		}
		n, err := migrations.DownTo(ctx, db, to)
		if err != nil {
			return err
		}
		fmt.Printf("rolled back %d migration(s); schema at version %d\n", n, to)
	case "status":
		cur, latest, err := migrations.Version(ctx, db)
		if err != nil {
			return err
		}
		fmt.Printf("schema at version %d; newest embedded %d\n", cur, latest)
	default:
		return fmt.Errorf("migrate: unknown action %q (want up, down or status)", action)
	}
	return nil
}

// migrateUp applies pending migrations at start (flywheel up).
func migrateUp(ctx context.Context, url string) error {
	db, err := migrations.Open(url)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = migrations.Up(ctx, db)
	return err
}

// requireSchema refuses to serve on a schema older than this binary's.
// openStore checks the schema and opens a small pool, for the commands
// that run a few statements and exit.
func openStore(ctx context.Context, url string) (*pgxpool.Pool, error) {
	if err := requireSchema(ctx, url); err != nil {
		return nil, err
	}
	return store.Open(ctx, url, 2)
}

func requireSchema(ctx context.Context, url string) error {
	db, err := migrations.Open(url)
	if err != nil {
		return err
	}
	defer db.Close()
	cur, latest, err := migrations.Version(ctx, db)
	if err != nil {
		return err
	}
	if cur < latest {
		return fmt.Errorf("database schema is at version %d but this binary needs %d: run `flywheel migrate`", cur, latest)
	}
	return nil
}
