package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/flywheel-ai/flywheel/store"
)

func runKeys(ctx context.Context, args []string) error {
	const usage = "flywheel keys create --tenant NAME [--name LABEL]"
	v, rest, err := verb(args, usage)
	if err != nil {
		return err
	}
	if v != "create" {
		return fmt.Errorf("unknown keys subcommand %q; usage: %s", v, usage)
	}
	var tenant, name string
	cfg, _, err := loadConfig("keys create", rest, func(fs *flag.FlagSet) {
		fs.StringVar(&tenant, "tenant", "", "tenant the key belongs to (created if new); required")
		fs.StringVar(&name, "name", "", "a label for the key")
	})
	if err != nil {
		return err
	}
	if tenant == "" {
		return fmt.Errorf("keys create: --tenant is required")
	}
	if err := store.ValidTenantName(tenant); err != nil {
		return err
	}
	pool, err := openStore(ctx, cfg.Database.URL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := store.EnsureTenant(ctx, pool, tenant); err != nil {
		return err
	}
	key, err := store.CreateKey(ctx, pool, tenant, "", name)
	if err != nil {
		return err
	}
	// Only the key goes to stdout, so `KEY=$(flywheel keys create …)` works.
	fmt.Println(key)
	return nil
}
