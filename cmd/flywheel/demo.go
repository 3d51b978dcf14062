package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/flywheel-ai/flywheel/demo"
	"github.com/flywheel-ai/flywheel/demo/demotask"
	"github.com/flywheel-ai/flywheel/demo/rehearsal"
)

// runDemo is `flywheel demo`: demo agents work the built-in task while the
// policy learns. --offline runs the whole loop in process (no services);
// otherwise the agents talk to the gateway at --base-url.
func runDemo(ctx context.Context, args []string) error {
	var (
		minutes  float64
		asJSON   bool
		offline  bool
		agents   int
		group    int
		baseURL  string
		apiKey   string
		outDir   string
		seed     uint64
		interval time.Duration
		pace     float64
		backlog  int
		loraRank int
		lr       float64
		taskName string
	)
	cfg, _, err := loadConfig("demo", args, func(fs *flag.FlagSet) {
		fs.Float64Var(&minutes, "minutes", 10, "length of the run in minutes (the base policy build, if not cached, comes first)")
		fs.BoolVar(&asJSON, "json", false, "print the summary as one JSON object on the last line")
		fs.BoolVar(&offline, "offline", false, "run in process: sample, verify, train, gate and release without the gateway or services")
		fs.IntVar(&agents, "agents", 4, "concurrent demo agents (online mode)")
		fs.IntVar(&group, "group-size", 8, "answers per prompt, sent as one GRPO group of sessions (online mode; 1: one X-Session-Id session per prompt)")
		fs.Float64Var(&pace, "sessions-per-second", 25, "cap on the sessions the fleet opens per second, so the control plane keeps up (online mode; 0: none)")
		fs.IntVar(&backlog, "max-backlog", 128, "hold new sessions back while more of them than this wait to be assembled (GET /v1/backlog), so a loaded control plane is fed as fast as it absorbs (online mode; 0: no limit)")
		fs.StringVar(&baseURL, "base-url", "", "gateway URL the agents use (online mode), e.g. http://127.0.0.1:8080")
		fs.StringVar(&apiKey, "api-key", os.Getenv("FLYWHEEL_API_KEY"), "API key the agents use (online mode; default $FLYWHEEL_API_KEY)")
		fs.StringVar(&outDir, "out", "", "directory for the curve and the status page (default DATA_DIR/demo)")
		fs.StringVar(&taskName, "task", demotask.TaskLetters, `the demo task: "letters" (reverse a few letters in one answer) or "tools" (look an attribute up with the right tool, then answer with it: a multi-turn session rewarded at its end; the deployment must serve the tools base, `+"`flywheel up --policy-base demo-tools`)")
		fs.Uint64Var(&seed, "seed", 1, "seed for prompts, the base policy and sampling")
		fs.IntVar(&loraRank, "lora-rank", 0, "train a LoRA adapter of this rank on attention, MLP and the unembedding instead of full weights (offline mode; 0: full weights)")
		fs.Float64Var(&lr, "lr", 0, "the RL learning rate (offline mode; 0: the rehearsal's default, tuned for full weights)")
		fs.DurationVar(&interval, "progress-every", demo.DefaultProgressInterval, "spacing of progress lines when stdout is not a terminal")
	})
	if err != nil {
		return err
	}
	task, err := demotask.Named(taskName)
	if err != nil {
		return err
	}
	if offline && task.Kind != "" {
		return errors.New("demo: --offline rehearses the letters task only; run --task tools online")
	}
	if minutes <= 0 || minutes > 24*60 {
		return fmt.Errorf("--minutes %v must be in (0, 1440]", minutes)
	}
	if !offline && (loraRank != 0 || lr != 0) {
		return errors.New("demo: --lora-rank and --lr set the offline rehearsal's trainer; give --offline (online, the deployment's trainer settings apply)")
	}
	if !offline && baseURL == "" {
		return errors.New("demo: give --base-url (and --api-key) of a running gateway, or --offline to run in process")
	}
	if outDir == "" {
		outDir = filepath.Join(cfg.DataDir, "demo")
	}
	log := newLogger(cfg.Log)
	budget := time.Duration(minutes * float64(time.Minute))

	// In --json mode stdout carries only the summary line; the bar goes to
	// stderr so scripts can still watch it.
	var progress io.Writer = os.Stdout
	tty := demo.IsTerminal(os.Stdout)
	if asJSON {
		progress, tty = os.Stderr, demo.IsTerminal(os.Stderr)
	}

	var sum demo.Summary
	if offline {
		sum, err = demo.RunOffline(ctx, demo.OfflineConfig{
			Rehearsal: rehearsal.Config{Budget: budget, Seed: seed, CacheDir: filepath.Join(cfg.DataDir, "demo-cache"), LoRARank: loraRank, LR: lr, Logger: log},
			OutDir:    outDir, Progress: progress, TTY: tty, ProgressInterval: interval,
		})
	} else {
		sum, err = demo.RunOnline(ctx, demo.OnlineConfig{
			Fleet: demo.FleetConfig{BaseURL: baseURL, APIKey: apiKey, Model: cfg.Gateway.PolicyModel, Agents: agents, GroupSize: group, Task: task,
				SessionsPerSecond: pace, MaxBacklog: backlog, Seed: seed, Logger: log},
			Duration: budget, OutDir: outDir, Progress: progress, TTY: tty, ProgressInterval: interval,
		})
	}
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if asJSON {
		fmt.Println(sum.JSON())
		return nil
	}
	fmt.Printf("success %.1f%% → %.1f%%, safety %.1f%% → %.1f%%, versions promoted %d, rolled back %d, serving %s\n",
		100*sum.SuccessStart, 100*sum.SuccessEnd, 100*sum.SafetyStart, 100*sum.SafetyEnd,
		sum.VersionsPromoted, sum.VersionsRolledBack, sum.ServingVersion)
	fmt.Printf("curve: %s, %s\nstatus page: %s\n", sum.CurvePNG, sum.CurveSVG, sum.StatusHTML)
	return nil
}
