package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/flywheel-ai/flywheel/store"
)

// runUsage prints accounted usage, as the admin API's /admin/v1/usage does.
func runUsage(ctx context.Context, args []string) error {
	var tenant, since, until string
	var keyID int64
	var byDay, asJSON bool
	cfg, _, err := loadConfig("usage", args, func(fs *flag.FlagSet) {
		fs.StringVar(&tenant, "tenant", "", "only this tenant (default: every tenant)")
		fs.Int64Var(&keyID, "key", 0, "only this tenant key id (see keys list)")
		fs.StringVar(&since, "since", "", "first UTC day, YYYY-MM-DD")
		fs.StringVar(&until, "until", "", "UTC day to stop before, YYYY-MM-DD")
		fs.BoolVar(&byDay, "by-day", false, "one row per day")
		fs.BoolVar(&asJSON, "json", false, "print JSON")
	})
	if err != nil {
		return err
	}
	f := store.UsageFilter{TenantID: tenant, KeyID: keyID, ByDay: byDay}
	for name, v := range map[string]string{"since": since, "until": until} {
		if v == "" {
			continue
		}
		d, err := time.Parse(time.DateOnly, v)
		if err != nil {
			return fmt.Errorf("usage: --%s %q: want YYYY-MM-DD", name, v)
		}
		if name == "since" {
			f.Since = d
		} else {
			f.Until = d
		}
	}
	pool, err := openStore(ctx, cfg.Database.URL)
	if err != nil {
		return err
	}
	defer pool.Close()
	rows, err := store.Usage(ctx, pool, f)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(rows)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "DAY\tTENANT\tKEY\tDEPLOYMENT\tREQUESTS\tERRORS\tPROMPT TOKENS\tCOMPLETION TOKENS\t")
	for _, r := range rows {
		day := r.Day
		if day == "" {
			day = "-"
		}
		key := fmt.Sprint(r.KeyID)
		if r.KeyName != "" {
			key += " (" + r.KeyName + ")"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t\n", day, r.TenantID, key, r.Deployment, r.Requests, r.Errors,
			r.PromptTokens, r.CompletionTokens)
	}
	return w.Flush()
}
