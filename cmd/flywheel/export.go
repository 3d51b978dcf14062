package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/flywheel-ai/flywheel/gateway"
	"github.com/flywheel-ai/flywheel/store"
)

// runExport writes a tenant's trajectories as ATDP JSONL or Parquet (the same steps
// GET /v1/trajectories serves: redacted, with rewards, returns and
// eligibility) to a file or stdout.
func runExport(ctx context.Context, args []string) error {
	var tenant, session, endUser, since, until, out, format string
	var limit int
	var eligible bool
	cfg, _, err := loadConfig("export", args, func(fs *flag.FlagSet) {
		fs.StringVar(&tenant, "tenant", "", "tenant whose data to export (required)")
		fs.StringVar(&session, "session-id", "", "only this session")
		fs.StringVar(&endUser, "end-user", "", "only this end user's sessions")
		fs.StringVar(&since, "since", "", "sessions created at or after this RFC 3339 time")
		fs.StringVar(&until, "until", "", "sessions created before this RFC 3339 time")
		fs.IntVar(&limit, "limit", 1000, "most sessions to export")
		fs.BoolVar(&eligible, "eligible", false, "only steps that will train")
		fs.StringVar(&out, "out", "-", "output file, - for stdout")
		fs.StringVar(&format, "format", gateway.FormatJSONL, "jsonl (ATDP, one step a line) or parquet (one row a step, for pandas, DuckDB, HF datasets)")
	})
	if err != nil {
		return err
	}
	if err := store.ValidTenantName(tenant); err != nil {
		return fmt.Errorf("export: --tenant: %w", err)
	}
	f := store.SessionFilter{TenantID: tenant, SessionID: session, EndUser: endUser, Limit: limit}
	for _, p := range []struct {
		name, v string
		dst     *time.Time
	}{{"since", since, &f.Since}, {"until", until, &f.Until}} {
		if p.v == "" {
			continue
		}
		if *p.dst, err = time.Parse(time.RFC3339Nano, p.v); err != nil {
			return fmt.Errorf("export: --%s: want an RFC 3339 time", p.name)
		}
	}
	pool, err := openStore(ctx, cfg.Database.URL)
	if err != nil {
		return err
	}
	defer pool.Close()
	var w io.Writer = os.Stdout
	if out != "-" {
		file, err := os.Create(out)
		if err != nil {
			return fmt.Errorf("export: %w", err)
		}
		defer file.Close()
		w = file
	}
	bw := bufio.NewWriter(w)
	rules, err := trajectoryRules(cfg)
	if err != nil {
		return err
	}
	n, err := gateway.Export(ctx, pool, rules, gateway.ExportOptions{Filter: f, EligibleOnly: eligible, Format: format}, bw)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	fmt.Fprintf(os.Stderr, "exported %d steps\n", n)
	return nil
}
