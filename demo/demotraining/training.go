// Package demotraining is how the demo deployment trains and releases
// when `flywheel up --policy-base demo` serves it: the control plane's
// training policy, scaled to a run of minutes, and the online trainer's
// configuration, which takes the rehearsal's tuned defaults.
package demotraining

import (
	"log/slog"
	"time"

	"github.com/flywheel-ai/flywheel/demo/rehearsal"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/trainer"
)

// TrainerConfig is the online trainer's configuration for the demo: the
// rehearsal's learning rate and advantage, onlineMiniBatches updates per
// batch, a learning rate scaled down for batches shorter than
// TrainingPolicy's, and the staleness bound η of TrainingPolicy (the
// trainer and the training loop must agree on it, or the loop claims
// batches the trainer refuses). The behaviour temperature is the
// trainer's default 1, the agents' default.
func TrainerConfig(log *slog.Logger) trainer.Config {
	c := rehearsal.DefaultTrainer()
	p := TrainingPolicy()
	c.MaxStaleness, c.NominalBatch, c.Logger = p.MaxStaleness, p.BatchSize, log
	c.MiniBatches = onlineMiniBatches
	return c
}

// ToolsTrainerConfig is TrainerConfig for the tools task, whose calls are
// about 45 tokens of which one (the tool's name) decides the reward: two
// updates a batch, not six. Online, six updates at the letters' rate rose
// for four steps, then broke the call's JSON at temperature 1 (the agents'
// own success fell from 17% to 8%; the gates rolled every candidate
// back). In process, on policy, steps of 18 groups of eight sessions,
// greedy success on the rehearsal's 200 held-out requests (until ac07232
// the very requests the online demo reports) after 60 steps from 0.175:
// six updates at 5e-4 0.000 (no well-formed call after 10 steps), two at
// 5e-4 0.680, two at 1e-3 0.340 (unstable), one at 1e-3 0.345; online,
// two at 2e-4 had not moved after 16 steps.
//
// A failed session's negative advantage weighs toolsNegativeWeight of a
// successful one's. Trained as online (the rehearsal sampling the serving
// version, the line up to four gates ahead), full negative advantages
// broke the sampled calls of version after version while their greedy
// calls passed the gate (greedy success on the tuning set stuck at 0.25
// for 50 steps; IcePop and KPop did not help): five sessions in six fail,
// and their negative advantages push down the call's format tokens as
// much as the good sessions push them up, which stale samples and Adam's
// normalisation turn into drift. With 0.2 the update is mostly the
// successful sessions' (asymmetric REINFORCE): 0.14 → 0.53, 0.595 and
// 0.655 in 60 steps on three seeds, where full weight reached 0.25 and
// 0.315 on two of them (docs/demo.md).
func ToolsTrainerConfig(log *slog.Logger) trainer.Config {
	c := TrainerConfig(log)
	c.MiniBatches = toolsMiniBatches
	c.Optim.LR = toolsLR
	c.Advantage.NegativeWeight = toolsNegativeWeight
	return c
}

// The tools task's updates a batch, learning rate and weight of a
// negative advantage.
const (
	toolsMiniBatches    = 2
	toolsLR             = 5e-4
	toolsNegativeWeight = 0.2
)

// onlineMiniBatches is the optimizer updates the online trainer makes on
// each batch (the rehearsal's default is two): 48 samples an update, as
// with steps of 192 and four, which learned faster at the same lag than
// two (0.76 vs 0.58 at step 80, one seed).
const onlineMiniBatches = 6

// TrainingPolicy is the demo deployment's control plane, scaled to a run of
// minutes instead of days: steps of 288 samples, short shadow and canary
// phases, and the default gates (reward may not drop more than 0.05,
// safety not at all). Training goes on while a candidate is gated, up to
// MaxAhead steps past the serving version.
func TrainingPolicy() flow.TrainingPolicy {
	return flow.TrainingPolicy{
		// 36 GRPO groups of eight a step. What holds learning back online
		// is how far serving trails the trainer: the agents sample the
		// serving version, and a candidate serves only once its release
		// (about 9.6 s with a 4 s canary) is through. The rehearsal run as
		// the online loop runs (FromServing, MaxAhead 4, an anchor gate on
		// 800 prompts; 15,360 samples, final held-out success):
		//   - steps of 192 with serving 2 steps behind: 0.78, 0.775, 0.80,
		//     0.58 and 0.745 (seeds 1-5);
		//   - steps of 192, 1 behind: 0.85, 0.845, 0.865, 0.80;
		//   - steps of 288 (6 updates), 1 behind: 0.79, 0.87, 0.90, 0.88,
		//     0.795.
		// Online, steps of 192 took 7.5 s and samples trained 2.5 versions
		// after the one that wrote them; a step of 288 takes 11.5 s, longer
		// than a release, so serving trails it by about one step.
		BatchSize: 288,
		// A batch takes about 11.5 s of the fleet's traffic to fill.
		MaxBatchAge: 15 * time.Second,
		// A group's 8 sessions come one after another from one agent and
		// are assembled apart; trained before the last arrive, 64 samples
		// made 10-28 partial groups (one run: 28 groups of 2.3 on average).
		GroupWait:    15 * time.Second,
		PollInterval: 500 * time.Millisecond,
		// Samples taken more than this many steps back are dropped; with
		// steps of 288 and the trainer at most MaxAhead past serving, few
		// come near it.
		MaxStaleness: 16,
		// The trainer leads serving by at most this many steps: a release
		// held up (a canary waiting for traffic) cannot stretch the lag the
		// samples train at beyond it, while a release (about two steps of
		// traffic) rarely reaches it.
		MaxAhead:    4,
		StepTimeout: 5 * time.Minute,
		Release: deployment.ReleasePolicy{
			// A release every few seconds: the replay and safety gates
			// judge every candidate on fixed prompts, so the live canary
			// only has to catch a clear loss on real traffic.
			ShadowDuration: time.Second,
			CanaryShare:    0.5,
			// Half the fleet's traffic gives the canary about 25 sessions
			// in 2 s, twice MinCanarySamples; a longer canary is lag.
			CanaryDuration:   2 * time.Second,
			CanaryChecks:     1,
			MinCanarySamples: 12,
			// A phase with too little traffic for a verdict (the fleet
			// slowed for a backlog) waits this much longer, then fails.
			MaxTrafficWait: 20 * time.Second,
		},
	}
}
