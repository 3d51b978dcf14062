package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/store"
)

const deploymentsUsage = `flywheel deployments create NAME --base-url URL [--model SERVED_NAME] [--api-key-env VAR] [--fallbacks M1,M2] [--dialect vllm|sglang|openai|anthropic] [--timeout 30s] [--retries N] [--weight-sync KIND] [--trainer JSON | --trainer-queue Q] [--base-model M] [--tokenizer T] [--gates JSON] [--evolution JSON]
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
	var f upstreamFlags
	cfg, fs, err := subcommand("deployments", v, rest, deploymentsUsage, map[string]func(fs *flag.FlagSet){
		"create": f.register, "update": f.register, "list": nil, "show": nil})
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
	var up deployment.Settings
	if v == "create" || v == "update" {
		if up, err = f.settings(); err != nil {
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
		return createDeployment(ctx, pool, name, up)
	case "update":
		return updateDeployment(ctx, pool, name, up)
	case "show":
		return showDeployment(ctx, pool, name)
	}
	return listDeployments(ctx, pool)
}

// upstreamFlags are the flags of `deployments create` and `update`: an
// upstream deployment's settings.
type upstreamFlags struct {
	up        deployment.Settings
	fallbacks string
	dialect   string
	vllm      bool
	retries   int
	timeout   time.Duration
	sync      deployment.WeightSync
	gates     string
	trainer   string
	evolution string
}

func (f *upstreamFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.up.BaseURL, "base-url", "", "the server's OpenAI-compatible base URL, ending in /v1; required")
	fs.StringVar(&f.up.Model, "model", "", "the server's name for the model (default: NAME)")
	fs.StringVar(&f.up.APIKeyEnv, "api-key-env", "", "environment variable holding the server's API key")
	fs.StringVar(&f.fallbacks, "fallbacks", "", "comma-separated models on the same server to try when this one fails")
	fs.StringVar(&f.dialect, "dialect", "", "the server's dialect, how its token ids are asked for: vllm (return_token_ids), sglang (native /generate) or openai (none; its samples do not train); or anthropic: Anthropic's Messages API, --base-url https://api.anthropic.com, Anthropic clients' bodies relayed (no ids either). Default: sglang with --weight-sync sglang_disk, else vllm")
	fs.BoolVar(&f.up.Responses, "responses", false, "with --dialect openai: the server speaks the Responses API too (api.openai.com), so a Responses client's body is relayed to its /responses, not converted to Chat Completions")
	fs.BoolVar(&f.vllm, "vllm", true, "older spelling: --vllm=false is --dialect openai")
	fs.DurationVar(&f.timeout, "timeout", 0, "bound on one attempt (default: gateway.upstream_timeout)")
	fs.IntVar(&f.retries, "retries", -1, "retries after the first attempt (default: gateway.upstream_retries)")
	fs.StringVar(&f.sync.Kind, "weight-sync", "", "how trained versions reach the server: vllm_lora (an adapter per version) or sglang_disk (full weights in place)")
	fs.StringVar(&f.sync.URL, "weight-sync-url", "", "where the server's weight endpoints are (default: from --base-url)")
	fs.StringVar(&f.up.TrainerQueue, "trainer-queue", "", "older form of --trainer '{\"kind\":\"temporal\",\"queue\":Q}': the task queue of your flywheel.train/v1 workers (docs/trainer-protocol.md)")
	fs.StringVar(&f.trainer, "trainer", "", `what trains this deployment, as JSON (docs/trainers.md), e.g. '{"kind":"tinker","url":"https://tinker.example.com","api_key_env":"TINKER_API_KEY","lora":{"rank":32}}'`)
	fs.StringVar(&f.up.BaseModel, "base-model", "", "what the weights start from, a hub id or a path the trainer reads (sent to the trainer as base.model)")
	fs.StringVar(&f.up.Tokenizer, "tokenizer", "", "the base model's tokenizer, where it is not the model's own")
	fs.StringVar(&f.evolution, "evolution", "", `how the cheap layers learn, as JSON (docs/evolution.md), e.g. '{"reflector":"gpt-strong","daily_tokens":200000}': the deployment whose model reads failed sessions, and its budgets`)
	fs.StringVar(&f.gates, "gates", "", `this deployment's release policy as JSON, e.g. '{"max_reward_drop": 0.02, "canary_duration": "3m"}': thresholds and phase timings (docs/gates.md lists the keys and defaults); each wins over its release's`)
}

// settings is the deployment the flags describe, validated; a flag left
// unset leaves its setting to the default.
func (f *upstreamFlags) settings() (deployment.Settings, error) {
	up := f.up
	up.Fallbacks = splitList(f.fallbacks)
	up.Dialect = deployment.Dialect(f.dialect)
	if !f.vllm {
		vllm := f.vllm
		up.VLLM = &vllm
	}
	if f.timeout > 0 {
		up.Timeout = f.timeout.String()
	}
	if f.retries >= 0 {
		retries := f.retries
		up.Retries = &retries
	}
	if f.sync.Kind != "" || f.sync.URL != "" {
		sync := f.sync
		up.WeightSync = &sync
	}
	if f.gates != "" {
		up.Gates = json.RawMessage(f.gates)
	}
	if f.trainer != "" {
		up.Trainer = new(deployment.Trainer)
		if err := decodeFlag("trainer", f.trainer, up.Trainer); err != nil {
			return deployment.Settings{}, err
		}
	}
	if f.evolution != "" {
		up.Evolution = new(deployment.Evolution)
		if err := decodeFlag("evolution", f.evolution, up.Evolution); err != nil {
			return deployment.Settings{}, err
		}
	}
	if err := up.Validate(); err != nil {
		return deployment.Settings{}, err
	}
	return up, nil
}

// decodeFlag decodes the JSON object of flag --name into v, refusing
// unknown fields.
func decodeFlag(name, value string, v any) error {
	dec := json.NewDecoder(strings.NewReader(value))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("--%s: %w", name, err)
	}
	return nil
}

func createDeployment(ctx context.Context, db store.DBTX, name string, up deployment.Settings) error {
	d, err := store.CreateUpstreamDeployment(ctx, db, name, up)
	if errors.Is(err, store.ErrExists) {
		return fmt.Errorf("deployments create: %q exists; `flywheel deployments update %s …` changes it", name, name)
	}
	if err != nil {
		return err
	}
	return printJSON(d)
}

func updateDeployment(ctx context.Context, db store.DBTX, name string, up deployment.Settings) error {
	d, err := store.UpdateUpstreamDeployment(ctx, db, name, up)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("deployments update: no deployment %q", name)
	case errors.Is(err, deployment.ErrNotUpstream):
		return fmt.Errorf("deployments update: %q is served by the in-process policy; it has no upstream to change", name)
	case err != nil:
		return err
	}
	return printJSON(d)
}

func showDeployment(ctx context.Context, db store.DBTX, name string) error {
	d, err := store.GetDeployment(ctx, db, name)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("deployments show: no deployment %q", name)
	}
	if err != nil {
		return err
	}
	return printJSON(d)
}

// listDeployments prints a table of every deployment and where it is
// served.
func listDeployments(ctx context.Context, db store.DBTX) error {
	ds, err := store.ListDeployments(ctx, db)
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
