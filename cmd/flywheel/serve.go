package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"

	"github.com/flywheel-ai/flywheel/activities"
	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/demo/demotask"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/gateway"
	"github.com/flywheel-ai/flywheel/modelserver"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/trainer"
	"github.com/flywheel-ai/flywheel/trajectory"
	"github.com/flywheel-ai/flywheel/worker"
)

// openService loads a long-running command's config and opens its pool
// on a database whose schema is current.
func openService(ctx context.Context, name string, args []string) (config.Config, *slog.Logger, *pgxpool.Pool, error) {
	cfg, _, err := loadConfig(name, args, nil)
	if err != nil {
		return cfg, nil, nil, err
	}
	logger := newLogger(cfg.Log)
	if err := requireSchema(ctx, cfg.Database.URL); err != nil {
		return cfg, nil, nil, err
	}
	pool, err := store.Open(ctx, cfg.Database.URL, cfg.Database.MaxConns)
	return cfg, logger, pool, err
}

func runGateway(ctx context.Context, args []string) error {
	cfg, logger, pool, err := openService(ctx, "gateway", args)
	if err != nil {
		return err
	}
	defer pool.Close()
	// Lazy: the gateway serves (and captures) while Temporal is down; the
	// notifier retries and session workflows reconcile from Postgres.
	c, err := client.NewLazyClient(client.Options{HostPort: cfg.Temporal.Address, Namespace: cfg.Temporal.Namespace,
		Logger: tlog.NewStructuredLogger(logger.With("component", "temporal"))})
	if err != nil {
		return fmt.Errorf("temporal client: %w", err)
	}
	defer c.Close()
	gw, err := newGateway(cfg, pool, c, logger)
	if err != nil {
		return err
	}
	return gw.ListenAndServe(ctx)
}

// newGateway wires the gateway: session notices to Temporal, metrics.
// Every model, the in-process policy included, is a deployment it reaches
// over HTTP (the policy through its model server).
func newGateway(cfg config.Config, pool *pgxpool.Pool, c client.Client, logger *slog.Logger) (*gateway.Server, error) {
	return gateway.New(cfg.Gateway, gateway.Deps{
		DB: pool, Logger: logger,
		Notifier:   gateway.NewTemporalNotifier(c, cfg.Gateway.NotifyInterval, logger),
		Forgets:    gateway.TemporalForgets{Client: c},
		Tokenizers: tokenizers(cfg),
	})
}

// tokenizers are the tokenizers Flywheel holds: the in-process policy's
// byte-level one under its model name. Upstream deployments' ids come from
// tokenizers it does not hold.
func tokenizers(cfg config.Config) map[string]trajectory.Tokenizer {
	return map[string]trajectory.Tokenizer{cfg.Gateway.PolicyModel: trainer.Tokenizer{}}
}

// trajectoryRules are the rules steps are built by, for export and for
// training alike.
func trajectoryRules(cfg config.Config) (trajectory.Rules, error) {
	return trajectory.NewRules(cfg.Gateway, tokenizers(cfg))
}

// policy is the in-process policy deployment: its name and the
// directory of its base model's checkpoint. Its model server serves it
// and the embedded trainer trains it, each over HTTP.
type policy struct {
	name string
	dir  trainer.CheckpointDir
}

// policyBase supplies the weights stored as v0 the first time a deployment
// is served, with their checkpoint metadata; meta[origin] tells a v0 from
// another base apart. nil: the seeded random model.
type policyBase struct {
	load   func(ctx context.Context) (*trainer.Model, map[string]string, error)
	origin string
	train  trainer.Config
	// task is the demo task the base was built for: its suites gate the
	// deployment.
	task demotask.Task
}

// newPolicy registers the in-process policy deployment, an upstream whose
// engine is the policy's model server and whose trainer is the embedded
// one, at urls (record: this process runs them, so the URLs it gives are
// the ones to store), with the seeded base model stored as version 0 the
// first time.
func newPolicy(ctx context.Context, cfg config.Config, pool *pgxpool.Pool, pb *policyBase, urls policyURLs, record bool, logger *slog.Logger) (*policy, error) {
	name := cfg.Gateway.PolicyModel
	dir := trainer.CheckpointDir{Dir: filepath.Join(cfg.DataDir, "checkpoints", name)}
	if _, meta, err := dir.Load(0); err != nil {
		base, meta, err := seededBase(ctx, pb)
		if err != nil {
			return nil, err
		}
		meta["deployment"] = name
		if _, err := dir.Save(base, 0, meta); err != nil {
			return nil, fmt.Errorf("policy base checkpoint: %w", err)
		}
	} else if pb != nil && meta[originKey] != pb.origin {
		// Training on from another base would mix two experiments.
		return nil, fmt.Errorf("policy: v0 of %s is %q, not %q; serve another deployment (--gateway-policy-model) or use a fresh --data-dir",
			name, meta[originKey], pb.origin)
	}
	train := trainer.Config{Logger: logger}
	if pb != nil {
		train = pb.train
	}
	tr, err := policyTrainer(cfg, train, name, urls.trainer)
	if err != nil {
		return nil, err
	}
	server := deployment.Settings{BaseURL: urls.model, Model: name, WeightSync: &deployment.WeightSync{Kind: deployment.WeightSyncVLLMLoRA},
		Trainer: tr}
	if _, err := store.EnsurePolicyDeployment(ctx, pool, name, store.VersionID(name, 0), dir.Path(0), server, record); err != nil {
		return nil, err
	}
	return &policy{name: name, dir: dir}, nil
}

// policyURLs are where the policy deployment's model server and trainer
// are reached, as its settings record them.
type policyURLs struct {
	model, trainer string
}

// modelServerURL is the base URL the gateway and workers reach the model
// server at: the configured one, else the address it listens on.
func modelServerURL(cfg config.Config, addr net.Addr) string {
	if cfg.ModelServer.URL != "" {
		return cfg.ModelServer.URL
	}
	if addr != nil {
		return "http://" + addr.String() + "/v1"
	}
	return "http://" + cfg.ModelServer.Listen + "/v1"
}

// serveModel runs the policy's model server on ln until ctx is done. Once
// it answers, the deployment's routed versions are loaded into it through
// the weight sync a release uses (vLLM's load_lora_adapter), so a fresh
// server serves what the routes name before any traffic reaches it;
// ready is closed then.
func serveModel(ctx context.Context, cfg config.Config, pool *pgxpool.Pool, pol *policy, ln net.Listener, ready chan<- struct{}, logger *slog.Logger) error {
	base, _, err := pol.dir.Load(0)
	if err != nil {
		return fmt.Errorf("model server: base: %w", err)
	}
	ms, err := modelserver.New(base, 0, modelserver.Config{Name: pol.name, BasePath: pol.dir.Path(0), Logger: logger,
		StateFile: filepath.Join(cfg.DataDir, "model-server", pol.name+".json")})
	if err != nil {
		return fmt.Errorf("model server: %w", err)
	}
	return serveHTTP(ctx, "model server", ln, ms, ready, func() error {
		weights := &activities.Release{DB: pool, Logger: logger}
		out, err := weights.SyncWeights(ctx, flow.SyncWeightsInput{Deployment: pol.name})
		if err != nil && ctx.Err() != nil {
			// Stopped while loading: a shutdown, not a failure. (The server
			// answers from its saved state already, so a caller may have seen
			// it ready and stopped it.)
			return nil
		}
		if err != nil {
			return fmt.Errorf("model server: load the routed versions: %w", err)
		}
		logger.Info(msgModelServerReady, "deployment", pol.name, "url", "http://"+ln.Addr().String()+"/v1", "loaded", out.Loaded, "kept", out.Kept)
		return nil
	})
}

// serveHTTP serves h on ln until ctx is done, then shuts it down (5 s for
// requests in flight). Once it serves, onServing runs (what the server
// must hold before it is announced); then ready is closed. A server that
// stops on its own is an error named by what.
func serveHTTP(ctx context.Context, what string, ln net.Listener, h http.Handler, ready chan<- struct{}, onServing func() error) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := onServing(); err != nil || ctx.Err() != nil {
		return err
	}
	if ready != nil {
		close(ready)
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-done:
		return fmt.Errorf("%s: %w", what, err)
	}
}

const msgModelServerReady = "model server ready"

const originKey = "origin"

// seededBase is the v0 of a new deployment: pb's weights, or a seeded
// random model.
func seededBase(ctx context.Context, pb *policyBase) (*trainer.Model, map[string]string, error) {
	if pb != nil {
		m, meta, err := pb.load(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("policy base: %w", err)
		}
		return m, meta, nil
	}
	m, err := trainer.NewModel(trainer.ModelConfig{}, 1)
	if err != nil {
		return nil, nil, fmt.Errorf("policy model: %w", err)
	}
	return m, map[string]string{originKey: "seeded base"}, nil
}

// runModelServer serves the in-process policy's weights in vLLM's HTTP
// dialect (chat completions with token ids and logprobs, runtime LoRA
// loading by version name, /tokenize), and records itself as the policy
// deployment's engine.
func runModelServer(ctx context.Context, args []string) error {
	cfg, logger, pool, err := openService(ctx, "model-server", args)
	if err != nil {
		return err
	}
	defer pool.Close()
	ln, err := net.Listen("tcp", cfg.ModelServer.Listen)
	if err != nil {
		return fmt.Errorf("model server listen on %s: %w", cfg.ModelServer.Listen, err)
	}
	pol, err := newPolicy(ctx, cfg, pool, nil, policyURLs{model: modelServerURL(cfg, ln.Addr()), trainer: trainerServerURL(cfg, nil)}, true, logger)
	if err != nil {
		_ = ln.Close()
		return err
	}
	return serveModel(ctx, cfg, pool, pol, ln, nil, logger)
}

func runWorker(ctx context.Context, args []string) error {
	cfg, logger, pool, err := openService(ctx, "worker", args)
	if err != nil {
		return err
	}
	defer pool.Close()
	c, err := worker.Dial(ctx, cfg.Temporal.Address, cfg.Temporal.Namespace, logger)
	if err != nil {
		return err
	}
	defer c.Close()
	// The worker reads the in-process policy's weights from the shared
	// checkpoint directory, and on the trainer queue it trains them. Its
	// gates ask the policy's model server, as for any deployment.
	pol, err := newPolicy(ctx, cfg, pool, nil, policyURLs{model: modelServerURL(cfg, nil), trainer: trainerServerURL(cfg, nil)}, false, logger)
	if err != nil {
		return err
	}
	var refl activities.Reflector
	switch key := os.Getenv(cfg.Worker.GatewayKey); {
	case cfg.Worker.GatewayURL == "":
	case key == "":
		logger.Warn(msgNoOperatorKey, "gateway_url", cfg.Worker.GatewayURL, "key_env", cfg.Worker.GatewayKey)
	default:
		refl = &activities.GatewayReflector{URL: cfg.Worker.GatewayURL, APIKey: key}
	}
	return serveWorker(ctx, cfg, c, pool, pol, nil, refl, logger)
}

// serveWorker registers every workflow and activity on the configured task
// queues and polls until ctx is done. With the in-process policy's weights
// (pol not nil) and the trainer queue it also trains them; with swe it
// also runs SWE rollouts in Docker sandboxes against that gateway. Release
// gates ask each deployment's own engine over HTTP.
func serveWorker(ctx context.Context, cfg config.Config, c client.Client, pool *pgxpool.Pool, pol *policy, swe *activities.SWEConfig,
	refl activities.Reflector, logger *slog.Logger) error {
	inv := worker.DetectCompute()
	worker.LogCompute(logger, inv)
	host, _ := os.Hostname()
	rules, err := trajectoryRules(cfg)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	engines := &activities.Engines{DB: pool, Timeout: cfg.Gateway.UpstreamTimeout,
		Retries: cfg.Gateway.UpstreamRetries}
	// Batches and checkpoints live under the data directory, which a
	// trainer in another process (or container) must share.
	d := worker.Deps{Pool: pool, Host: host, Compute: inv.Compute(), Logger: logger, Rules: rules, Temporal: c,
		CheckpointDir: filepath.Join(cfg.DataDir, "checkpoints"), BatchDir: filepath.Join(cfg.DataDir, "batches"),
		RewardMin: cfg.Gateway.RewardMin, RewardMax: cfg.Gateway.RewardMax, Backend: engines, Reflector: refl}
	if swe != nil {
		a, closeSWE, err := activities.NewSWEActivities(ctx, *swe)
		if err != nil {
			return fmt.Errorf("worker: %w", err)
		}
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := closeSWE(ctx); err != nil {
				logger.Warn(msgSWECloseFailed, "err", err)
			}
		}()
		d.SWE = a
	}
	all := worker.Registrations(d)
	queues := map[string]worker.Registrar{}
	for _, q := range cfg.Worker.TaskQueues {
		r, ok := all[q]
		if !ok {
			return fmt.Errorf("worker: unknown task queue %q", q)
		}
		queues[q] = r
	}
	return worker.Run(ctx, c, queues, logger)
}

const (
	msgSWECloseFailed = "removing this worker's sandboxes failed"
	msgNoOperatorKey  = "no operator key for the gateway: evolution's reflector is off on this worker, so the cheap layers propose nothing"
)
