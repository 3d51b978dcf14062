package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference/weightsync"
	"github.com/flywheel-ai/flywheel/store"
)

const deploymentsUsage = `flywheel deployments create NAME --base-url URL [--model SERVED_NAME] [--api-key-env VAR] [--fallbacks M1,M2] [--dialect vllm|sglang|openai] [--timeout 30s] [--retries N] [--weight-sync KIND] [--trainer-queue Q] [--base-model M] [--tokenizer T] [--gates JSON]
       flywheel deployments update NAME --base-url URL [same flags as create]
       flywheel deployments list
       flywheel deployments show NAME`

// runDeployments manages deployments, as the admin API's
// /admin/v1/deployments does. Gateways route a change within a second.
func runDeployments(ctx context.Context, args []string) error {
	v, rest, err := verb(args, deploymentsUsage)
	if err != nil {
		return err
	}
	var up deployment.Settings
	var fallbacks string
	var dialect string
	vllm := true
	retries := -1
	var timeout time.Duration
	var sync weightsync.Settings
	var gates string
	upstreamFlags := func(fs *flag.FlagSet) {
		fs.StringVar(&up.BaseURL, "base-url", "", "the server's OpenAI-compatible base URL, ending in /v1; required")
		fs.StringVar(&up.Model, "model", "", "the server's name for the model (default: NAME)")
		fs.StringVar(&up.APIKeyEnv, "api-key-env", "", "environment variable holding the server's API key")
		fs.StringVar(&fallbacks, "fallbacks", "", "comma-separated models on the same server to try when this one fails")
		fs.StringVar(&dialect, "dialect", "", "the server's dialect, how its token ids are asked for: vllm (return_token_ids), sglang (native /generate) or openai (none; its samples do not train). Default: sglang with --weight-sync sglang_disk, else vllm")
		fs.BoolVar(&vllm, "vllm", true, "older spelling: --vllm=false is --dialect openai")
		fs.DurationVar(&timeout, "timeout", 0, "bound on one attempt (default: gateway.upstream_timeout)")
		fs.IntVar(&retries, "retries", -1, "retries after the first attempt (default: gateway.upstream_retries)")
		fs.StringVar(&sync.Kind, "weight-sync", "", "how trained versions reach the server: vllm_lora (an adapter per version) or sglang_disk (full weights in place)")
		fs.StringVar(&sync.URL, "weight-sync-url", "", "where the server's weight endpoints are (default: from --base-url)")
		fs.StringVar(&up.TrainerQueue, "trainer-queue", "", "task queue of the workers that train this deployment (docs/trainer-protocol.md; default flywheel-trainer)")
		fs.StringVar(&up.BaseModel, "base-model", "", "what the weights start from, a hub id or a path the trainer reads (sent to the trainer as base.model)")
		fs.StringVar(&up.Tokenizer, "tokenizer", "", "the base model's tokenizer, where it is not the model's own")
		fs.StringVar(&gates, "gates", "", `this deployment's release-gate thresholds as JSON, e.g. '{"allow_unevaluated": true, "max_reward_drop": 0.02}' (allow_unevaluated, max_reward_drop, anchor_budget, max_safety_drop, max_error_rise, alpha, min_canary_samples); each wins over its release's`)
	}
	cfg, fs, err := subcommand("deployments", v, rest, deploymentsUsage, map[string]func(fs *flag.FlagSet){
		"create": upstreamFlags, "update": upstreamFlags, "list": nil, "show": nil})
	if err != nil {
		return err
	}
	var name string
	if v != "list" {
		if name, err = one(fs.Args(), "deployment name"); err != nil {
			return fmt.Errorf("deployments %s: %w", v, err)
		}
		if err := deployment.ValidName(name); err != nil {
			return fmt.Errorf("deployments %s: %w", v, err)
		}
	}
	if v == "create" || v == "update" {
		up.Fallbacks = splitList(fallbacks)
		up.Dialect = deployment.Dialect(dialect)
		if !vllm {
			up.VLLM = &vllm
		}
		if timeout > 0 {
			up.Timeout = timeout.String()
		}
		if retries >= 0 {
			up.Retries = &retries
		}
		if sync.Kind != "" || sync.URL != "" {
			up.WeightSync = &sync
		}
		if gates != "" {
			up.Gates = json.RawMessage(gates)
		}
		if err := up.Validate(); err != nil {
			return fmt.Errorf("deployments %s: %w", v, err)
		}
	}
	pool, err := openStore(ctx, cfg.Database.URL)
	if err != nil {
		return err
	}
	defer pool.Close()
	switch v {
	case "create":
		d, err := store.CreateUpstreamDeployment(ctx, pool, name, up)
		if errors.Is(err, store.ErrExists) {
			return fmt.Errorf("deployments create: %q exists; `flywheel deployments update %s …` changes it", name, name)
		}
		if err != nil {
			return err
		}
		return printJSON(d)
	case "update":
		d, err := store.UpdateUpstreamDeployment(ctx, pool, name, up)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return fmt.Errorf("deployments update: no deployment %q", name)
		case errors.Is(err, deployment.ErrNotUpstream):
			return fmt.Errorf("deployments update: %q is served by the in-process policy; it has no upstream to change", name)
		case err != nil:
			return err
		}
		return printJSON(d)
	case "show":
		d, err := store.GetDeployment(ctx, pool, name)
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("deployments show: no deployment %q", name)
		}
		if err != nil {
			return err
		}
		return printJSON(d)
	}
	ds, err := store.ListDeployments(ctx, pool)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tBACKEND\tSERVING\tTARGET\tUPDATED")
	for _, d := range ds {
		target := "-"
		if d.Backend == deployment.BackendUpstream {
			if c, err := deployment.Parse(d.Config); err == nil {
				target = c.BaseURL
				if c.Model != "" {
					target += " (" + c.Model + ")"
				}
			} else {
				target = "unusable config: " + err.Error()
			}
		}
		serving := d.ServingVersion
		if serving == "" {
			serving = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", d.Name, d.Backend, serving, target, d.UpdatedAt.Format(time.RFC3339))
	}
	return w.Flush()
}
