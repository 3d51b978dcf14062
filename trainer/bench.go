package trainer

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"sort"
	"time"
)

// BenchConfig sizes `flywheel bench trainer`.
type BenchConfig struct {
	// Model is the training-throughput model. Default 4 layers, d_model 256,
	// 4 heads, FFN 1024, context 256.
	Model ModelConfig
	// Seqs×SeqLen tokens form the throughput batch. Default 8×256.
	Seqs, SeqLen int
	// Steps timed per measurement (after one warm-up). Default 5.
	Steps int
	// Groups of GroupSize samples of PackLen tokens sharing PackShare of
	// them measure packing. Default 2 groups of 8, 128 tokens, 0.75.
	Groups, GroupSize, PackLen int
	PackShare                  float64
	// SampleSeqs sequences of SampleTokens new tokens measure sampling on
	// the default (embedded) policy. Default 64×64.
	SampleSeqs, SampleTokens int
}

func (c BenchConfig) withDefaults() BenchConfig {
	if c.Seqs == 0 {
		c.Seqs = 8
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
		c.Model.Context = max(256, c.SeqLen, c.PackLen)
	}
	c.Model = c.Model.withDefaults()
	if c.Steps == 0 {
		c.Steps = 5
	}
	if c.Groups == 0 {
		c.Groups = 2
	}
	if c.GroupSize == 0 {
		c.GroupSize = 8
	}
	if c.PackLen == 0 {
		c.PackLen = 128
	}
	if c.PackShare == 0 {
		c.PackShare = 0.75
	}
	if c.SampleSeqs == 0 {
		c.SampleSeqs = 64
	}
	if c.SampleTokens == 0 {
		c.SampleTokens = 64
	}
	return c
}

// BenchResult is the benchmark's JSON line.
type BenchResult struct {
	BLAS            string  `json:"blas"`
	Threads         int     `json:"threads"`
	TrainTokensPerS float64 `json:"train_tokens_per_s"`
	GFLOPS          float64 `json:"gflops"`
	SgemmGFLOPS     float64 `json:"sgemm_gflops"`
	FlopsRatio      float64 `json:"flops_ratio"`
	// FlopsRatioPaired is the median over steps of the step's GFLOP/s over
	// an SGEMM measured just before it: robust to load from other processes.
	FlopsRatioPaired float64 `json:"flops_ratio_paired"`
	// FlopsRatio1Core is the same on one goroutine against one-thread
	// SGEMM: the kernel's efficiency without any cross-core waiting.
	FlopsRatio1Core  float64 `json:"flops_ratio_1core"`
	GonumSgemmGFLOPS float64 `json:"gonum_sgemm_gflops"`
	// BLASSpeedup is SgemmGFLOPS over the pure-Go kernel, same run.
	BLASSpeedup        float64 `json:"blas_speedup"`
	SampleTokensPerS   float64 `json:"sample_tokens_per_s"`
	SampleSingleTokPS  float64 `json:"sample_single_stream_tokens_per_s"`
	PolicyTrainTokPS   float64 `json:"policy_train_tokens_per_s"`
	PackingSpeedup     float64 `json:"packing_speedup"`
	PackingTheoretical float64 `json:"packing_theoretical"`
	PackingEfficiency  float64 `json:"packing_efficiency"`
}

// RunBench measures the trainer and prints progress to w; the caller prints
// the returned result as the last line.
func RunBench(ctx context.Context, cfg BenchConfig, w io.Writer) (BenchResult, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Model.validate(); err != nil {
		return BenchResult{}, fmt.Errorf("bench model: %w", err)
	}
	r := &benchRun{cfg: cfg, cpus: runtime.NumCPU(), w: w, res: BenchResult{BLAS: BLASName()}}
	if err := r.sgemm(ctx); err != nil {
		return r.res, err
	}
	SetBLASThreads(1)
	SetParallelism(r.cpus)
	defer SetParallelism(runtime.GOMAXPROCS(0))
	r.res.GonumSgemmGFLOPS = measureSgemm(512, 512, 512, sgemmGonum)
	fmt.Fprintf(w, "sgemm gonum (pure Go) 512^3: %.1f GFLOP/s\n", r.res.GonumSgemmGFLOPS)
	r.res.BLASSpeedup = r.res.SgemmGFLOPS / r.res.GonumSgemmGFLOPS

	r.res.Threads = r.cpus
	// One stream of random tokens for every batch and prompt below, drawn
	// in this order.
	r.rng = rand.New(rand.NewPCG(1, 2))
	m, err := NewModel(cfg.Model, 1)
	if err != nil {
		return r.res, err
	}
	if err := r.training(ctx, m); err != nil {
		return r.res, err
	}
	if err := r.packing(ctx, m); err != nil {
		return r.res, err
	}
	if err := r.policy(ctx); err != nil {
		return r.res, err
	}
	return r.res, nil
}

// benchRun is one RunBench: its settings, where progress goes, and the
// result filled in section by section.
type benchRun struct {
	cfg  BenchConfig
	cpus int
	w    io.Writer
	rng  *rand.Rand
	res  BenchResult
}

// sgemm measures the best of the shapes the training step uses and a
// square one, with BLAS's own threads (1 and all cores) and split by
// goroutines the way the passes call it.
func (r *benchRun) sgemm(ctx context.Context) error {
	cfg, cpus := r.cfg, r.cpus
	d, f, n := cfg.Model.DModel, cfg.Model.FFN, cfg.Seqs*cfg.SeqLen
	shapes := [][3]int{{1024, 1024, 1024}, {n, 3 * d, d}, {n, f, d}, {n, d, f}}
	for _, mode := range []struct {
		name             string
		blasThreads, par int
		fn               sgemmFunc
	}{
		{"blas threads=1", 1, 1, sgemm},
		{fmt.Sprintf("blas threads=%d", cpus), cpus, 1, sgemm},
		{fmt.Sprintf("goroutines=%d", cpus), 1, cpus, psgemm},
	} {
		if cpus == 1 && mode.name != "blas threads=1" {
			continue // the same measurement again
		}
		SetBLASThreads(mode.blasThreads)
		SetParallelism(mode.par)
		for _, s := range shapes {
			g := measureSgemm(s[0], s[1], s[2], mode.fn)
			fmt.Fprintf(r.w, "sgemm %s %s %dx%dx%d: %.1f GFLOP/s\n", r.res.BLAS, mode.name, s[0], s[1], s[2], g)
			r.res.SgemmGFLOPS = max(r.res.SgemmGFLOPS, g)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// training measures training throughput on m, unpacked, every completion
// token trained, against the best SGEMM and against an SGEMM measured next
// to each step.
func (r *benchRun) training(ctx context.Context, m *Model) error {
	cfg, cpus, res := r.cfg, r.cpus, &r.res
	d, f, n := cfg.Model.DModel, cfg.Model.FFN, cfg.Seqs*cfg.SeqLen
	fmt.Fprintf(r.w, "train model: %d params, layers=%d d_model=%d ffn=%d; batch %d×%d; goroutines=%d\n",
		m.NumParams(), cfg.Model.Layers, d, f, cfg.Seqs, cfg.SeqLen, cpus)
	b := benchBatch(r.rng, cfg.Seqs, 1, cfg.SeqLen, cfg.SeqLen/8)
	sec, flops, tokens, err := timeSteps(ctx, m, b, true, cfg.Steps)
	if err != nil {
		return err
	}
	res.TrainTokensPerS = float64(tokens) / sec
	res.GFLOPS = flops / sec / 1e9
	res.FlopsRatio = res.GFLOPS / res.SgemmGFLOPS
	fmt.Fprintf(r.w, "train: %.0f tokens/s, %.1f GFLOP/s achieved (%.2f of best SGEMM)\n", res.TrainTokensPerS, res.GFLOPS, res.FlopsRatio)

	// On a shared machine the two bests above may come from different load;
	// pair each step with an SGEMM measured right before it (the step's
	// largest product, split the same way) and keep the median ratio.
	res.FlopsRatioPaired, err = pairedRatio(ctx, m, b, cfg.Steps, [3]int{n, f, d})
	if err != nil {
		return err
	}
	SetParallelism(1)
	res.FlopsRatio1Core, err = pairedRatio(ctx, m, b, cfg.Steps, [3]int{n, f, d})
	SetParallelism(cpus)
	if err != nil {
		return err
	}
	fmt.Fprintf(r.w, "train vs SGEMM measured next to each step: median ratio %.2f (%d goroutines), %.2f (one core)\n",
		res.FlopsRatioPaired, cpus, res.FlopsRatio1Core)
	return nil
}

// packing times m's step with and without prefix sharing, alternated so
// that both see the same load, on one core (packing removes work; it does
// not change how the work spreads), and sets the median speed-up beside the
// theoretical one (sample tokens over packed nodes).
func (r *benchRun) packing(ctx context.Context, m *Model) error {
	cfg, res := r.cfg, &r.res
	shared := int(float64(cfg.PackLen) * cfg.PackShare)
	pb := benchBatch(r.rng, cfg.Groups, cfg.GroupSize, cfg.PackLen, shared)
	SetParallelism(1)
	var err error
	res.PackingSpeedup, err = PackingSpeedup(ctx, m, pb, cfg.Steps)
	SetParallelism(r.cpus)
	if err != nil {
		return err
	}
	seqs := make([][]int, len(pb.Samples))
	for i, s := range pb.Samples {
		seqs[i] = s.TokenIDs
	}
	pk, err := BuildPack(seqs, true)
	if err != nil {
		return err
	}
	res.PackingTheoretical = float64(pk.NumSampleTokens()) / float64(pk.NumNodes())
	res.PackingEfficiency = res.PackingSpeedup / res.PackingTheoretical
	fmt.Fprintf(r.w, "packing: groups of %d sharing %.0f%%: %.2fx faster (theoretical %.2fx)\n",
		cfg.GroupSize, 100*cfg.PackShare, res.PackingSpeedup, res.PackingTheoretical)
	return nil
}

// policy measures the embedded default policy: sampling (batched and one
// stream) and packed GRPO training.
func (r *benchRun) policy(ctx context.Context) error {
	cfg, res := r.cfg, &r.res
	pm, err := NewModel(ModelConfig{}, 2)
	if err != nil {
		return err
	}
	res.SampleTokensPerS, err = timeSampling(ctx, pm, r.rng, cfg.SampleSeqs, cfg.SampleTokens)
	if err != nil {
		return err
	}
	res.SampleSingleTokPS, err = timeSampling(ctx, pm, r.rng, 1, cfg.SampleTokens)
	if err != nil {
		return err
	}
	fmt.Fprintf(r.w, "sample (default policy, %d params): %.0f tokens/s batched ×%d, %.0f tokens/s single stream\n",
		pm.NumParams(), res.SampleTokensPerS, cfg.SampleSeqs, res.SampleSingleTokPS)
	psec, _, ptok, err := timeSteps(ctx, pm, benchBatch(r.rng, 16, 8, 32, 24), false, cfg.Steps)
	if err != nil {
		return err
	}
	res.PolicyTrainTokPS = float64(ptok) / psec
	fmt.Fprintf(r.w, "train (default policy, GRPO groups of 8, packed): %.0f sample tokens/s\n", res.PolicyTrainTokPS)
	return nil
}

// JSON renders the result as one line.
func (r BenchResult) JSON() string {
	b, _ := json.Marshal(r)
	return string(b)
}

type sgemmFunc func(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)

func measureSgemm(m, n, k int, fn sgemmFunc) float64 {
	a, b, c := make([]float32, m*k), make([]float32, k*n), make([]float32, m*n)
	for i := range a {
		a[i] = float32(i%7) * 0.1
	}
	for i := range b {
		b[i] = float32(i%5) * 0.1
	}
	fn(false, false, m, n, k, 1, a, k, b, n, 0, c, n)
	best := 0.0
	for rep := 0; rep < 3; rep++ {
		start := time.Now()
		iters := 0
		for time.Since(start) < 200*time.Millisecond {
			fn(false, false, m, n, k, 1, a, k, b, n, 0, c, n)
			iters++
		}
		g := 2 * float64(m) * float64(n) * float64(k) * float64(iters) / time.Since(start).Seconds() / 1e9
		best = max(best, g)
	}
	return best
}

// benchBatch makes groups×size GRPO samples of length n whose first shared
// tokens are common within a group; the rest is trained.
func benchBatch(rng *rand.Rand, groups, size, n, shared int) *Batch {
	b := &Batch{}
	for g := 0; g < groups; g++ {
		prefix := make([]int, shared)
		for i := range prefix {
			prefix[i] = rng.IntN(256)
		}
		for j := 0; j < size; j++ {
			s := Sample{GroupID: fmt.Sprint(g), TokenIDs: append(make([]int, 0, n), prefix...),
				LossMask: make([]uint8, n), Logprobs: make([]float32, n), Versions: make([]int64, n), Reward: float64(j % 2)}
			for len(s.TokenIDs) < n {
				s.TokenIDs = append(s.TokenIDs, rng.IntN(256))
			}
			for t := max(shared, 1); t < n; t++ {
				s.LossMask[t], s.Logprobs[t] = 1, -5.5
			}
			b.Samples = append(b.Samples, s)
		}
	}
	return b
}

// timeSteps runs one warm-up step and then steps timed ones, and reports
// the fastest step: the machine is shared, and the fastest step is the one
// least disturbed (the SGEMM figure is a best-of too).
func timeSteps(ctx context.Context, m *Model, b *Batch, noPacking bool, steps int) (sec, flops float64, tokens int, err error) {
	l, err := NewLocal(m, 0, Config{NoPacking: noPacking, MaxStaleness: -1}, nil)
	if err != nil {
		return 0, 0, 0, err
	}
	if _, err := l.TrainStep(ctx, b); err != nil {
		return 0, 0, 0, err
	}
	for i := 0; i < steps; i++ {
		start := time.Now()
		r, err := l.TrainStep(ctx, b)
		if err != nil {
			return 0, 0, 0, err
		}
		if s := time.Since(start).Seconds(); i == 0 || s < sec {
			sec, flops, tokens = s, r.FLOPs, r.TotalTokens
		}
	}
	return sec, flops, tokens, nil
}

func timeSampling(ctx context.Context, m *Model, rng *rand.Rand, seqs, tokens int) (float64, error) {
	prompts := make([][]int, seqs)
	for i := range prompts {
		p := []int{TokImStart}
		for j := 0; j < 15; j++ {
			p = append(p, 'a'+rng.IntN(26))
		}
		prompts[i] = p
	}
	start := time.Now()
	gens, err := m.Generate(ctx, prompts, SampleOptions{MaxTokens: tokens}, rng, nil)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, g := range gens {
		n += len(g.IDs)
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

func pairedRatio(ctx context.Context, m *Model, b *Batch, steps int, shape [3]int) (float64, error) {
	l, err := NewLocal(m, 0, Config{NoPacking: true, MaxStaleness: -1}, nil)
	if err != nil {
		return 0, err
	}
	var ratios []float64
	for i := 0; i < steps; i++ {
		g := measureSgemm(shape[0], shape[1], shape[2], psgemm)
		start := time.Now()
		r, err := l.TrainStep(ctx, b)
		if err != nil {
			return 0, err
		}
		ratios = append(ratios, r.FLOPs/time.Since(start).Seconds()/1e9/g)
	}
	sort.Float64s(ratios)
	return ratios[len(ratios)/2], nil
}

// PackingSpeedup is how many times faster m trains on b with prefix
// sharing than without: the median over rounds of alternated steps (so
// both see the same load), each step on a fresh trainer from m.
func PackingSpeedup(ctx context.Context, m *Model, b *Batch, rounds int) (float64, error) {
	plain, err := NewLocal(m, 0, Config{NoPacking: true, MaxStaleness: -1}, nil)
	if err != nil {
		return 0, err
	}
	packed, err := NewLocal(m, 0, Config{MaxStaleness: -1}, nil)
	if err != nil {
		return 0, err
	}
	step := func(l *Local) (float64, error) {
		start := time.Now()
		_, err := l.TrainStep(ctx, b)
		return time.Since(start).Seconds(), err
	}
	if _, err := step(plain); err != nil { // warm-up
		return 0, err
	}
	var ratios []float64
	for i := 0; i < rounds; i++ {
		a, err := step(plain)
		if err != nil {
			return 0, err
		}
		p, err := step(packed)
		if err != nil {
			return 0, err
		}
		ratios = append(ratios, a/p)
	}
	sort.Float64s(ratios)
	return ratios[len(ratios)/2], nil
}
