package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/flywheel-ai/flywheel/store"
)

const keysUsage = `flywheel keys create --tenant NAME [--name NAME] [--label KEY=VALUE]... [--models M1,M2] [--expires 720h] [--token-budget N [--budget-period day|month]] [--tpm N]
       flywheel keys list [--tenant NAME] [--all] [--sessions]
       flywheel keys revoke ID
       flywheel keys rotate ID [--grace 24h]`

// runKeys manages API keys, as the admin API's /admin/v1/keys does.
func runKeys(ctx context.Context, args []string) error {
	v, rest, err := verb(args, keysUsage)
	if err != nil {
		return err
	}
	var f keysFlags
	cfg, fs, err := subcommand("keys", v, rest, keysUsage, map[string]func(fs *flag.FlagSet){
		"create": f.registerCreate, "list": f.registerList, "revoke": nil, "rotate": f.registerRotate})
	if err != nil {
		return err
	}
	var id int64
	switch v {
	case "create":
		if err := f.checkCreate(); err != nil {
			return err
		}
	case "revoke", "rotate":
		if id, err = keyID(v, fs.Args()); err != nil {
			return err
		}
		if f.grace < 0 {
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
		return createKey(ctx, pool, f)
	case "list":
		keys, err := store.ListKeys(ctx, pool, store.KeyFilter{TenantID: f.tenant, All: f.all, Sessions: f.sessions})
		if err != nil {
			return err
		}
		printKeys(keys)
	case "revoke":
		return revokeKey(ctx, pool, id)
	case "rotate":
		return rotateKey(ctx, pool, id, f.grace)
	}
	return nil
}

// keysFlags are the flags of every `keys` subcommand.
type keysFlags struct {
	tenant, name, models, period string
	budget                       int64
	tpm                          *int64
	labels                       map[string]string
	expires, grace               time.Duration
	all, sessions                bool
}

func (f *keysFlags) registerCreate(fs *flag.FlagSet) {
	fs.StringVar(&f.tenant, "tenant", "", "tenant the key belongs to (created if new); required")
	fs.StringVar(&f.name, "name", "", fmt.Sprintf("the key's name, for its operators (at most %d characters)", store.MaxKeyName))
	fs.Func("label", fmt.Sprintf("a free label KEY=VALUE for the key's operators, listed with it; repeat for more (at most %d)", store.MaxKeyLabels), func(v string) error {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return fmt.Errorf("want KEY=VALUE, got %q", v)
		}
		if _, dup := f.labels[k]; dup {
			return fmt.Errorf("label %q given twice", k)
		}
		if f.labels == nil {
			f.labels = map[string]string{}
		}
		f.labels[k] = val
		return nil
	})
	fs.StringVar(&f.models, "models", "", "comma-separated model names the key may use (default: all)")
	fs.DurationVar(&f.expires, "expires", 0, "the key ends after this long (default: never)")
	fs.Int64Var(&f.budget, "token-budget", 0, "prompt and completion tokens the key (and its session keys) may use per --budget-period; over it calls get 429 (default: no budget)")
	fs.StringVar(&f.period, "budget-period", store.BudgetDay, "the budget's period, in UTC: day or month")
	fs.Func("tpm", "prompt and completion tokens per minute the key (and its session keys) may use; 0: no token rate limit (default: the gateway's gateway.rate_limit_tpm)", func(v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return errors.New("want a number of tokens per minute")
		}
		f.tpm = &n
		return nil
	})
}

func (f *keysFlags) registerList(fs *flag.FlagSet) {
	fs.StringVar(&f.tenant, "tenant", "", "only this tenant's keys")
	fs.BoolVar(&f.all, "all", false, "include revoked and expired keys")
	fs.BoolVar(&f.sessions, "sessions", false, "include per-session keys")
}

func (f *keysFlags) registerRotate(fs *flag.FlagSet) {
	fs.DurationVar(&f.grace, "grace", 0, "how long the old key keeps working (default: it stops now)")
}

// checkCreate refuses a key `keys create` could not issue, before the
// database is opened.
func (f *keysFlags) checkCreate() error {
	if f.tenant == "" {
		return errors.New("keys create: --tenant is required")
	}
	if err := store.ValidTenantName(f.tenant); err != nil {
		return err
	}
	if f.expires < 0 {
		return errors.New("keys create: --expires must be positive")
	}
	if err := store.ValidBudget(f.budget, f.period); err != nil {
		return fmt.Errorf("keys create: %w", err)
	}
	if err := store.ValidTPM(f.tpm); err != nil {
		return fmt.Errorf("keys create: --%w", err)
	}
	if err := store.ValidKeyMeta(f.name, f.labels); err != nil {
		return fmt.Errorf("keys create: %w", err)
	}
	return nil
}

// keyID is the one key id subcommand v was given.
func keyID(v string, pos []string) (int64, error) {
	s, err := one(pos, "key id")
	if err != nil {
		return 0, fmt.Errorf("keys %s: %w", v, err)
	}
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("keys %s: key id %q: want a positive integer (see keys list)", v, s)
	}
	return id, nil
}

// createKey issues the key f describes, creating its tenant if new.
func createKey(ctx context.Context, db store.DBTX, f keysFlags) error {
	if err := store.EnsureTenant(ctx, db, f.tenant); err != nil {
		return err
	}
	spec := store.KeySpec{TenantID: f.tenant, Name: f.name, Models: splitList(f.models), TokenBudget: f.budget, BudgetPeriod: f.period, TPM: f.tpm,
		Labels: f.labels}
	if f.expires > 0 {
		spec.ExpiresAt = time.Now().Add(f.expires)
	}
	key, _, err := store.IssueKey(ctx, db, spec)
	if err != nil {
		return err
	}
	// Only the key goes to stdout, so `KEY=$(flywheel keys create …)` works.
	fmt.Println(key)
	return nil
}

func revokeKey(ctx context.Context, db store.DBTX, id int64) error {
	k, err := store.RevokeKey(ctx, db, id)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("keys revoke: no key %d", id)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "revoked key %d (%s…, tenant %s) and the session keys it issued; gateways stop accepting it within gateway.key_cache_ttl\n",
		k.ID, k.Prefix, k.TenantID)
	return nil
}

func rotateKey(ctx context.Context, db store.Beginner, id int64, grace time.Duration) error {
	key, k, err := store.RotateKey(ctx, db, id, grace)
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

// labelList writes labels as sorted KEY=VALUE pairs, "-" for none.
func labelList(labels map[string]string) string {
	if len(labels) == 0 {
		return "-"
	}
	pairs := make([]string, 0, len(labels))
	for k, v := range labels {
		pairs = append(pairs, k+"="+v)
	}
	slices.Sort(pairs)
	return strings.Join(pairs, ",")
}

func printKeys(keys []store.Key) {
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tTENANT\tKIND\tPREFIX\tNAME\tLABELS\tMODELS\tBUDGET\tTPM\tCREATED\tEXPIRES\tSTATE")
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
		fmt.Fprintf(w, "%d\t%s\t%s\t%s…\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.TenantID, k.Kind, k.Prefix, k.Name, labelList(k.Labels), models, budget, tpm,
			k.CreatedAt.Format(time.RFC3339), expires, state)
	}
	w.Flush()
}
