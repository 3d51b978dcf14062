package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"

	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/tinkerserver"
	"github.com/flywheel-ai/flywheel/trainer"
)

// trainerServerURL is the root URL workers reach the embedded trainer at:
// the configured one, else the address it listens on.
func trainerServerURL(cfg config.Config, addr net.Addr) string {
	if cfg.Trainer.URL != "" {
		return cfg.Trainer.URL
	}
	if addr != nil {
		return "http://" + addr.String()
	}
	return "http://" + cfg.Trainer.Listen
}

// policyTrainer is the policy deployment's trainer: the embedded trainer
// at url, driven through the Tinker API as any Tinker service is, with
// the in-process trainer's configuration tc (its loss, minibatches and
// AdamW) and the configured masks and LoRA rank.
func policyTrainer(cfg config.Config, tc trainer.Config, name, url string) (*deployment.Trainer, error) {
	tc, err := tc.Resolve()
	if err != nil {
		return nil, fmt.Errorf("policy trainer: %w", err)
	}
	t := cfg.Trainer
	tr := &deployment.Trainer{Kind: deployment.TrainerTinker, URL: url, BaseModel: name,
		LoRA:    deployment.LoRA{Rank: t.LoRARank, FullWeights: t.LoRARank == 0},
		Loss:    deployment.LossPPO,
		Masks:   &deployment.TokenMasks{IcePop: t.IcePop, IcePopLow: t.IcePopLow, IcePopHigh: t.IcePopHigh, KPop: t.KPop, KPopPhi: t.KPopPhi},
		ClipLow: tc.Loss.ClipLow, ClipHigh: tc.Loss.ClipHigh, BehaviourWeightCap: tc.Loss.BehaviourWeightCap, KLCoef: tc.Loss.KLCoef,
		MiniBatches: tc.MiniBatches, NominalBatch: tc.NominalBatch,
		Adam: deployment.Adam{LR: tc.Optim.LR, Beta1: tc.Optim.Beta1, Beta2: tc.Optim.Beta2, Eps: tc.Optim.Eps,
			WeightDecay: tc.Optim.WeightDecay, GradClipNorm: max(tc.Optim.ClipNorm, 0)},
		Advantage: &deployment.Advantage{Estimator: tc.Advantage.Estimator, BaselineRate: tc.Advantage.BaselineRate,
			PerfectAdvantage: tc.Advantage.PerfectAdvantage, NegativeWeight: tc.Advantage.NegativeWeight},
	}
	if t.LoRARank > 0 {
		on := true
		tr.LoRA.Attn, tr.LoRA.MLP, tr.LoRA.Unembed = &on, &on, &on // every linear layer
	}
	if err := tr.WithDefaults(name).Validate(); err != nil {
		return nil, fmt.Errorf("policy trainer: %w", err)
	}
	return tr, nil
}

// serveTrainer runs the embedded trainer on ln until ctx is done: the Go
// trainer of the policy behind the Tinker API, training from the policy's
// v0 (its base model, named as the deployment). Its states and sampler
// archives live under the data directory. ready is closed once it serves.
func serveTrainer(ctx context.Context, cfg config.Config, pol *policy, ln net.Listener, ready chan<- struct{}, logger *slog.Logger) error {
	base, _, err := pol.dir.Load(0)
	if err != nil {
		return fmt.Errorf("trainer server: base: %w", err)
	}
	ts, err := tinkerserver.New(tinkerserver.Config{BaseModels: map[string]*trainer.Model{pol.name: base},
		Dir: filepath.Join(cfg.DataDir, "trainer-server"), Logger: logger})
	if err != nil {
		return fmt.Errorf("trainer server: %w", err)
	}
	defer ts.Close()
	return serveHTTP(ctx, "trainer server", ln, ts, ready, func() error {
		logger.Info(msgTrainerServerReady, "deployment", pol.name, "url", "http://"+ln.Addr().String())
		return nil
	})
}

const msgTrainerServerReady = "trainer server ready"

// runTrainerServer serves the embedded trainer alone (the Tinker training
// API over the in-process policy), for a deployment that runs the model
// server, the trainer and the workers apart.
func runTrainerServer(ctx context.Context, args []string) error {
	cfg, logger, pool, err := openService(ctx, "trainer-server", args)
	if err != nil {
		return err
	}
	defer pool.Close()
	ln, err := net.Listen("tcp", cfg.Trainer.Listen)
	if err != nil {
		return fmt.Errorf("trainer server listen on %s: %w", cfg.Trainer.Listen, err)
	}
	pol, err := newPolicy(ctx, cfg, pool, nil, policyURLs{model: modelServerURL(cfg, nil), trainer: trainerServerURL(cfg, ln.Addr())}, false, logger)
	if err != nil {
		_ = ln.Close()
		return err
	}
	return serveTrainer(ctx, cfg, pol, ln, nil, logger)
}
