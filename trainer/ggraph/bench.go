package ggraph

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/flywheel-ai/flywheel/trainer"
)

// BenchConfig sizes `flywheel bench ggraph`.
type BenchConfig struct {
	// Model is the throughput model. Default as `flywheel bench trainer`:
	// 4 layers, d_model 256, 4 heads, FFN 1024.
	Model trainer.ModelConfig
	// Seqs×SeqLen tokens form the unpacked throughput batch. Default 4×256.
	Seqs, SeqLen int
	// Steps timed per path (after one warm-up step that also builds the
	// graph). Default 3.
	Steps int
}

func (c BenchConfig) withDefaults() BenchConfig {
	if c.Seqs == 0 {
		c.Seqs = 4
	}
	if c.SeqLen == 0 {
		c.SeqLen = 256
	}
	if c.Model.Layers == 0 {
		c.Model.Layers = 4
	}
	if c.Model.Heads == 0 {
		c.Model.Heads = 4
	}
	if c.Model.DModel == 0 {
		c.Model.DModel = 256
	}
	if c.Model.Context == 0 {
		c.Model.Context = max(256, c.SeqLen)
	}
	if c.Steps == 0 {
		c.Steps = 3
	}
	return c
}

// BenchCase is one batch trained through both paths.
type BenchCase struct {
	Name string `json:"name"`
	// Nodes is the number of packed tokens the graph runs as one sequence.
	Nodes int `json:"nodes"`
	// Hand-written (trainer.Local) and gorgonia throughput: sample tokens
	// per second and useful GFLOP/s (the hand-written path's FLOP count for
	// both, so the ratio is the time ratio).
	HandTokensPerS  float64 `json:"hand_tokens_per_s"`
	GraphTokensPerS float64 `json:"graph_tokens_per_s"`
	HandGFLOPS      float64 `json:"hand_gflops"`
	GraphGFLOPS     float64 `json:"graph_gflops"`
	GraphOverHand   float64 `json:"graph_over_hand"`
	// CPU seconds per step (all threads), less sensitive than wall time to
	// other load on a shared machine, and the speed ratio they give
	// (hand CPU-s / graph CPU-s, like GraphOverHand: below 1 is slower).
	HandCPUSeconds    float64 `json:"hand_cpu_seconds"`
	GraphCPUSeconds   float64 `json:"graph_cpu_seconds"`
	GraphOverHandCPU  float64 `json:"graph_over_hand_cpu"`
	GraphBuildSeconds float64 `json:"graph_build_seconds"`
	AttentionBlocks   int     `json:"attention_blocks"`
	AttentionBlockLen int     `json:"attention_block_len"`
	// AttentionWaste is the graph's attention work (blocks·len²) over the
	// useful Σ n² per tree.
	AttentionWaste float64 `json:"attention_waste"`
}

// BenchResult is the benchmark's JSON line.
type BenchResult struct {
	BLAS       string      `json:"blas"`
	GOMAXPROCS int         `json:"gomaxprocs"`
	Cases      []BenchCase `json:"cases"`
}

// JSON renders the result as one line.
func (r BenchResult) JSON() string {
	b, _ := json.Marshal(r)
	return string(b)
}

// RunBench trains the same batches through trainer.Local and through the
// gorgonia Trainer and reports both rates; progress goes to w, the caller
// prints the result as the last line.
func RunBench(ctx context.Context, cfg BenchConfig, w io.Writer) (BenchResult, error) {
	cfg = cfg.withDefaults()
	res := BenchResult{BLAS: BLASName(), GOMAXPROCS: runtime.GOMAXPROCS(0)}
	rng := rand.New(rand.NewPCG(1, 2))

	big, err := trainer.NewModel(cfg.Model, 1)
	if err != nil {
		return res, fmt.Errorf("bench model: %w", err)
	}
	demo, err := trainer.NewModel(trainer.ModelConfig{}, 2)
	if err != nil {
		return res, err
	}
	cases := []struct {
		name   string
		m      *trainer.Model
		b      *trainer.Batch
		unpack bool
	}{
		{fmt.Sprintf("throughput %dx%d unpacked, %d params", cfg.Seqs, cfg.SeqLen, big.NumParams()), big,
			trainer.BenchBatch(rng, cfg.Seqs, 1, cfg.SeqLen, cfg.SeqLen/8), true},
		{fmt.Sprintf("demo policy %d params, GRPO 16 groups of 8, packed", demo.NumParams()), demo,
			trainer.BenchBatch(rng, 16, 8, 32, 24), false},
		{"demo policy, one GRPO group of 8, packed", demo,
			trainer.BenchBatch(rng, 1, 8, 64, 32), false},
	}
	for _, c := range cases {
		bc, err := benchCase(ctx, c.m, c.b, c.unpack, cfg.Steps)
		if err != nil {
			return res, fmt.Errorf("%s: %w", c.name, err)
		}
		bc.Name = c.name
		fmt.Fprintf(w, "%s: %d nodes in %d attention blocks of %d (waste %.2fx)\n", c.name, bc.Nodes, bc.AttentionBlocks, bc.AttentionBlockLen, bc.AttentionWaste)
		fmt.Fprintf(w, "  hand-written %.0f tokens/s %.2f GFLOP/s %.3f CPU-s/step; gorgonia %.0f tokens/s %.2f GFLOP/s %.3f CPU-s/step; gorgonia/hand %.2fx wall, %.2fx CPU; graph build %.2fs\n",
			bc.HandTokensPerS, bc.HandGFLOPS, bc.HandCPUSeconds, bc.GraphTokensPerS, bc.GraphGFLOPS, bc.GraphCPUSeconds, bc.GraphOverHand, bc.GraphOverHandCPU, bc.GraphBuildSeconds)
		res.Cases = append(res.Cases, bc)
	}
	return res, nil
}

func benchCase(ctx context.Context, m *trainer.Model, b *trainer.Batch, unpack bool, steps int) (BenchCase, error) {
	var bc BenchCase
	cfg := trainer.Config{NoPacking: unpack, MaxStaleness: -1}
	local, err := trainer.NewLocal(m, 0, cfg, nil)
	if err != nil {
		return bc, err
	}
	gg, err := NewTrainer(m, 0, cfg, nil)
	if err != nil {
		return bc, err
	}
	defer gg.Close()

	plan, err := trainer.PlanLoss(withAdvantages(b.Samples), b.Temperature, false, !unpack)
	if err != nil {
		return bc, err
	}
	bc.Nodes = plan.Pack.NumNodes()
	var useful float64
	for _, t := range plan.Pack.Trees {
		useful += float64(t.N) * float64(t.N)
	}
	in, err := gg.eng.packInputs(plan.Pack, plan.Targets)
	if err != nil {
		return bc, err
	}
	bc.AttentionBlocks, bc.AttentionBlockLen = in.blocks, in.blockLen
	bc.AttentionWaste = float64(in.blocks) * float64(in.blockLen) * float64(in.blockLen) / useful
	flops := 3 * ForwardFLOPs(m.Config, plan)

	// run times steps steps after one warm-up (which, for the graph, builds
	// it); wall and CPU seconds per step.
	run := func(t trainer.Trainer) (wall, cpu float64, err error) {
		if _, err := t.TrainStep(ctx, b); err != nil {
			return 0, 0, err
		}
		start, c0 := time.Now(), processCPU()
		for i := 0; i < steps; i++ {
			if _, err := t.TrainStep(ctx, b); err != nil {
				return 0, 0, err
			}
		}
		n := float64(steps)
		return time.Since(start).Seconds() / n, (processCPU() - c0).Seconds() / n, nil
	}
	handSec, handCPU, err := run(local)
	if err != nil {
		return bc, err
	}
	graphSec, graphCPU, err := run(gg)
	if err != nil {
		return bc, err
	}
	bc.GraphBuildSeconds = gg.eng.BuildTime.Seconds()
	bc.HandCPUSeconds, bc.GraphCPUSeconds = handCPU, graphCPU
	if graphCPU > 0 {
		bc.GraphOverHandCPU = handCPU / graphCPU
	}
	tokens := float64(plan.Pack.NumSampleTokens())
	bc.HandTokensPerS, bc.GraphTokensPerS = tokens/handSec, tokens/graphSec
	bc.HandGFLOPS, bc.GraphGFLOPS = flops/handSec/1e9, flops/graphSec/1e9
	bc.GraphOverHand = bc.GraphTokensPerS / bc.HandTokensPerS
	return bc, nil
}

// withAdvantages gives every sample a placeholder advantage so a plan can
// be made for counting; the trainers compute their own.
func withAdvantages(s []trainer.Sample) []trainer.Sample {
	out := append([]trainer.Sample(nil), s...)
	for i := range out {
		if out[i].Advantage == nil {
			a := 0.0
			out[i].Advantage = &a
		}
	}
	return out
}
