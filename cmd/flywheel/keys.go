package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/flywheel-ai/flywheel/store"
)

const keysUsage = `flywheel keys create --tenant NAME [--name LABEL] [--models M1,M2] [--expires 720h] [--token-budget N [--budget-period day|month]] [--tpm N]
       flywheel keys list [--tenant NAME] [--all] [--sessions]
       flywheel keys revoke ID
       flywheel keys rotate ID [--grace 24h]`

// runKeys manages API keys, as the admin API's /admin/v1/keys does.
func runKeys(ctx context.Context, args []string) error {
	v, rest, err := verb(args, keysUsage)
	if err != nil {
		return err
	}
	var tenant, name, models, period string
	var budget int64
	var tpm *int64
	var expires, grace time.Duration
	var all, sessions bool
	cfg, fs, err := subcommand("keys", v, rest, keysUsage, map[string]func(fs *flag.FlagSet){
		"create": func(fs *flag.FlagSet) {
			fs.StringVar(&tenant, "tenant", "", "tenant the key belongs to (created if new); required")
			fs.StringVar(&name, "name", "", "a label for the key")
			fs.StringVar(&models, "models", "", "comma-separated model names the key may use (default: all)")
			fs.DurationVar(&expires, "expires", 0, "the key ends after this long (default: never)")
			fs.Int64Var(&budget, "token-budget", 0, "prompt and completion tokens the key (and its session keys) may use per --budget-period; over it calls get 429 (default: no budget)")
			fs.StringVar(&period, "budget-period", store.BudgetDay, "the budget's period, in UTC: day or month")
			fs.Func("tpm", "prompt and completion tokens per minute the key (and its session keys) may use; 0: no token rate limit (default: the gateway's gateway.rate_limit_tpm)", func(v string) error {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return errors.New("want a number of tokens per minute")
				}
				tpm = &n
				return nil
			})
		},
		"list": func(fs *flag.FlagSet) {
			fs.StringVar(&tenant, "tenant", "", "only this tenant's keys")
			fs.BoolVar(&all, "all", false, "include revoked and expired keys")
			fs.BoolVar(&sessions, "sessions", false, "include per-session keys")
		},
		"revoke": nil,
		"rotate": func(fs *flag.FlagSet) {
			fs.DurationVar(&grace, "grace", 0, "how long the old key keeps working (default: it stops now)")
		},
	})
	if err != nil {
		return err
	}
	var id int64
	switch v {
	case "create":
		if tenant == "" {
			return errors.New("keys create: --tenant is required")
		}
		if err := store.ValidTenantName(tenant); err != nil {
			return err
		}
		if expires < 0 {
			return errors.New("keys create: --expires must be positive")
		}
		if err := store.ValidBudget(budget, period); err != nil {
			return fmt.Errorf("keys create: %w", err)
		}
		if err := store.ValidTPM(tpm); err != nil {
			return fmt.Errorf("keys create: --%w", err)
		}
	case "revoke", "rotate":
		s, err := one(fs.Args(), "key id")
		if err != nil {
			return fmt.Errorf("keys %s: %w", v, err)
		}
		if id, err = strconv.ParseInt(s, 10, 64); err != nil || id <= 0 {
			return fmt.Errorf("keys %s: key id %q: want a positive integer (see keys list)", v, s)
		}
		if grace < 0 {
			return errors.New("keys rotate: --grace must not be negative")
		}
	}
	pool, err := openStore(ctx, cfg.Database.URL)
	if err != nil {
		return err
	}
	defer pool.Close()
	switch v {
	case "create":
		if err := store.EnsureTenant(ctx, pool, tenant); err != nil {
			return err
		}
		spec := store.KeySpec{TenantID: tenant, Name: name, Models: splitList(models), TokenBudget: budget, BudgetPeriod: period, TPM: tpm}
		if expires > 0 {
			spec.ExpiresAt = time.Now().Add(expires)
		}
		key, _, err := store.IssueKey(ctx, pool, spec)
		if err != nil {
			return err
		}
		// Only the key goes to stdout, so `KEY=$(flywheel keys create …)` works.
		fmt.Println(key)
	case "list":
		keys, err := store.ListKeys(ctx, pool, store.KeyFilter{TenantID: tenant, All: all, Sessions: sessions})
		if err != nil {
			return err
		}
		printKeys(keys)
	case "revoke":
		k, err := store.RevokeKey(ctx, pool, id)
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("keys revoke: no key %d", id)
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "revoked key %d (%s…, tenant %s) and the session keys it issued; gateways stop accepting it within gateway.key_cache_ttl\n",
			k.ID, k.Prefix, k.TenantID)
	case "rotate":
		key, k, err := store.RotateKey(ctx, pool, id, grace)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return fmt.Errorf("keys rotate: no key %d", id)
		case errors.Is(err, store.ErrKeyNotLive):
			return fmt.Errorf("keys rotate: key %d is revoked or expired; create a new key instead", id)
		case err != nil:
			return err
		}
		fmt.Fprintf(os.Stderr, "key %d replaces key %d, which works for %s more\n", k.ID, id, grace)
		fmt.Println(key)
	}
	return nil
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

func printKeys(keys []store.Key) {
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tTENANT\tKIND\tPREFIX\tNAME\tMODELS\tBUDGET\tTPM\tCREATED\tEXPIRES\tSTATE")
	now := time.Now()
	for _, k := range keys {
		models := "all"
		if len(k.Models) > 0 {
			models = strings.Join(k.Models, ",")
		}
		expires := "never"
		if k.ExpiresAt != nil {
			expires = k.ExpiresAt.Format(time.RFC3339)
		}
		budget := "none"
		if k.TokenBudget > 0 {
			budget = fmt.Sprintf("%d/%s", k.TokenBudget, k.BudgetPeriod)
		}
		tpm := "default"
		if k.TPM != nil {
			tpm = strconv.FormatInt(*k.TPM, 10)
			if *k.TPM == 0 {
				tpm = "none"
			}
		}
		state := "live"
		switch {
		case k.RevokedAt != nil:
			state = "revoked"
		case !k.Live(now):
			state = "expired"
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s…\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.TenantID, k.Kind, k.Prefix, k.Name, models, budget, tpm,
			k.CreatedAt.Format(time.RFC3339), expires, state)
	}
	w.Flush()
}
