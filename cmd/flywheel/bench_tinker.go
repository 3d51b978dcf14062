package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/flywheel-ai/flywheel/activities"
	"github.com/flywheel-ai/flywheel/demo/demotask"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/tinker"
	"github.com/flywheel-ai/flywheel/tinkerserver"
	"github.com/flywheel-ai/flywheel/trainer"
	"github.com/flywheel-ai/flywheel/trainer/parquetbatch"
)

// flywheel bench tinker: the cost of the Tinker training API itself, the
// share of a train step spent outside the trainer's compute. The same
// demo-sized GRPO batch is trained, step after step from the previous
// step's saved state, two ways that do the same passes:
//
//   - direct: the learner in process: load the state, one forward pass for
//     the proximal log-probs, a forward_backward (ppo) and an optimizer
//     step per minibatch, then the training state and the sampler weights
//     written to disk: the trainer's compute and its file writes.
//   - api: TinkerTraining.TrainBatch, the production train step, against
//     the embedded trainer on a loopback listener: all of the above plus
//     reading the batch file, JSON, HTTP, futures and polling, the sampler
//     archive (tar.gz) and its download and unpacking.
//
// api_share = 1 − direct/api. The two alternate (and swap order every
// step), so drift in the machine's load falls on both.
func init() {
	benchCommands["tinker"] = runBenchTinker
}

// benchTinkerBase is the base model's name on the embedded trainer.
const benchTinkerBase = "bench-policy"

type benchTinkerConfig struct {
	Steps, MiniBatches, Rank, Groups, GroupSize int
	Seed                                        uint64
	// CPUProfile, when set, is the prefix of the api side's per-step CPU
	// profiles (PREFIX.1, PREFIX.2, …; go tool pprof merges them).
	CPUProfile string
	// Routes counts each route's calls, bytes and time on the api side:
	// the counting reads and decodes what it counts, which the api's
	// figure then includes.
	Routes bool
}

func runBenchTinker(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench tinker", flag.ContinueOnError)
	var cfg benchTinkerConfig
	fs.IntVar(&cfg.Steps, "steps", 5, "timed train steps of each way")
	fs.IntVar(&cfg.MiniBatches, "mini-batches", 6, "optimizer steps per train step (whole groups each)")
	fs.IntVar(&cfg.Rank, "lora-rank", 0, "LoRA rank (0: full weights)")
	fs.IntVar(&cfg.Groups, "groups", 36, "GRPO groups in the batch")
	fs.IntVar(&cfg.GroupSize, "group-size", 8, "samples per group")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the model and the prompts")
	fs.StringVar(&cfg.CPUProfile, "cpuprofile", "", "write CPU profiles of the api side's steps (client and server) to PREFIX.1, PREFIX.2, …")
	fs.BoolVar(&cfg.Routes, "routes", false, "count each route's calls, bytes and time on the api side (the counting adds to the api's time)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cfg.Steps < 1 || cfg.MiniBatches < 1 || cfg.Rank < 0 || cfg.Groups < 1 || cfg.GroupSize < 2 {
		return errors.New("bench tinker: --steps, --mini-batches and --groups must be positive, --group-size at least 2, --lora-rank not negative")
	}
	if err := benchTinker(ctx, cfg); err != nil {
		return fmt.Errorf("bench tinker: %w", err)
	}
	return nil
}

func benchTinker(ctx context.Context, cfg benchTinkerConfig) error {
	dir, err := os.MkdirTemp("", "flywheel-bench-tinker-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	model, err := trainer.NewModel(trainer.ModelConfig{}, cfg.Seed)
	if err != nil {
		return err
	}
	samples, batch, err := benchTinkerBatch(ctx, model, cfg, filepath.Join(dir, "batch.parquet"))
	if err != nil {
		return err
	}
	tc := deployment.Trainer{Kind: deployment.TrainerTinker, LoRA: deployment.LoRA{Rank: cfg.Rank, FullWeights: cfg.Rank == 0, Seed: int64(cfg.Seed)},
		Loss: deployment.LossPPO, MiniBatches: cfg.MiniBatches}
	srv, err := tinkerserver.New(tinkerserver.Config{BaseModels: map[string]*trainer.Model{benchTinkerBase: model},
		Dir: filepath.Join(dir, "server"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: srv}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()
	tc.URL = "http://" + ln.Addr().String()
	tc = tc.WithDefaults(benchTinkerBase)

	// The api side's client is the one a worker uses (nil: the default)
	// unless the routes are counted.
	api := &apiRunner{tt: &activities.TinkerTraining{Logger: slog.New(slog.DiscardHandler)}, cfg: tc, batch: batch, dir: filepath.Join(dir, "api")}
	var wire *countingTransport
	if cfg.Routes {
		wire = &countingTransport{next: http.DefaultTransport, routes: map[string]*routeStat{}, futures: map[string]string{}}
		api.tt.HTTP = &http.Client{Transport: wire}
	}
	direct := &directRunner{base: model, cfg: tc, samples: samples, dir: filepath.Join(dir, "direct")}

	tokens := 0
	for _, s := range samples {
		for _, m := range s.LossMask {
			tokens += int(m)
		}
	}
	rank := "full weights"
	if cfg.Rank > 0 {
		rank = fmt.Sprintf("LoRA rank %d", cfg.Rank)
	}
	fmt.Printf("batch: %d samples in %d groups of %d, %d trained tokens; model %d layers, d_model %d, %d weights; %s; %d minibatches, loss ppo\n",
		len(samples), cfg.Groups, cfg.GroupSize, tokens, model.Config.Layers, model.Config.DModel, len(model.W), rank, cfg.MiniBatches)
	fmt.Println("direct: learner in process: load state, forward, per minibatch forward_backward + optim_step, save state, write sampler weights")
	fmt.Println("api:    TrainBatch on the embedded trainer over loopback HTTP: the same, plus batch file, JSON, futures, archive, download, unpack")

	api.profile = cfg.CPUProfile
	var directT, apiT, cpuDiffs []float64
	for i := 0; i < cfg.Steps; i++ {
		var d, a time.Duration
		var dLoss, aLoss float64
		var errD, errA error
		if i%2 == 0 {
			d, dLoss, errD = direct.step(ctx, i)
			a, aLoss, errA = api.step(ctx, i)
		} else {
			a, aLoss, errA = api.step(ctx, i)
			d, dLoss, errD = direct.step(ctx, i)
		}
		if err := errors.Join(errD, errA); err != nil {
			return err
		}
		directT, apiT = append(directT, d.Seconds()), append(apiT, a.Seconds())
		cpuDiffs = append(cpuDiffs, (api.cpu - direct.cpu).Seconds())
		fmt.Printf("step %d: direct %7.1f ms  api %7.1f ms  (loss direct %.6g, api %.6g)\n", i+1, ms(d), ms(a), dLoss, aLoss)
	}
	dm, am := median(directT), median(apiT)
	share := 1 - dm/am
	// Each step's two ways ran back to back: their difference leaves out
	// the machine's drift between steps, which the medians of each way
	// keep.
	diffs := make([]float64, len(apiT))
	for i := range apiT {
		diffs[i] = apiT[i] - directT[i]
	}
	paired := median(diffs) / am
	res := map[string]any{"bench": "tinker", "steps": cfg.Steps, "samples": len(samples), "trained_tokens": tokens,
		"mini_batches": cfg.MiniBatches, "lora_rank": cfg.Rank, "direct_median_s": dm, "api_median_s": am, "api_share": share,
		"api_share_paired": paired}
	fmt.Printf("median: direct %.1f ms, api %.1f ms; api_share = 1 − direct/api = %.1f %% of a step outside the trainer's compute\n",
		dm*1e3, am*1e3, 100*share)
	fmt.Printf("paired: the median of (api − direct) step by step is %.1f ms, api_share_paired = %.1f %% of the api's median step\n",
		median(diffs)*1e3, 100*paired)
	// CPU time, the process's (every thread, client and server), leaves
	// out how much of the API's work overlapped the compute on idle
	// cores: it is what the API costs a machine whose cores are busy.
	res["api_cpu_s"] = median(cpuDiffs)
	fmt.Printf("cpu: the median of (api − direct) CPU time step by step is %.1f ms\n", median(cpuDiffs)*1e3)
	if wire != nil {
		sent, recv := wire.report(cfg.Steps, mean(apiT))
		res["sent_bytes_per_step"], res["received_bytes_per_step"] = sent, recv
	}
	read, err := timeBatchRead(batch)
	if err != nil {
		return err
	}
	fmt.Printf("of the api's step, reading and checking the batch file alone takes %.1f ms\n", ms(read))
	res["batch_read_s"] = read.Seconds()
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	return nil
}

// benchTinkerBatch writes the demo-sized batch: each group one demo prompt
// rendered as the engine renders it and GroupSize answers (the right one,
// then walks and shuffles of its letters), rewarded by the demo's
// verifier, GRPO advantages, and the model's own log-probs as the
// behaviour policy's. It returns the samples as the train step reads them.
func benchTinkerBatch(ctx context.Context, model *trainer.Model, cfg benchTinkerConfig, path string) ([]trainer.Sample, flow.BatchRef, error) {
	gen, err := demotask.NewGenerator(demotask.DefaultTask, cfg.Seed, nil)
	if err != nil {
		return nil, flow.BatchRef{}, err
	}
	var samples []trainer.Sample
	var prompts []int
	for g := 0; g < cfg.Groups; g++ {
		p := gen.Next()
		ids, err := demotask.PromptIDs(p.Text)
		if err != nil {
			return nil, flow.BatchRef{}, err
		}
		for j := 0; j < cfg.GroupSize; j++ {
			answer := p.Want
			switch {
			case j == 0:
			case j%2 == 1:
				answer = gen.Walk(p)
			default:
				answer = gen.Permutation(p)
			}
			seq := append(slices.Clone(ids), demotask.AnswerIDs(answer)...)
			mask := make([]uint8, len(seq))
			for t := len(ids); t < len(seq); t++ {
				mask[t] = 1
			}
			samples = append(samples, trainer.Sample{GroupID: fmt.Sprintf("g%d", g), TaskID: "reverse", TokenIDs: seq, LossMask: mask,
				Logprobs: make([]float32, len(seq)), Versions: make([]int64, len(seq)), Reward: demotask.Verify(p.Want, answer).Reward})
			prompts = append(prompts, len(ids))
		}
	}
	if _, err := trainer.ComputeAdvantages(samples, trainer.AdvantageConfig{}, trainer.NewBaseline(0.1)); err != nil {
		return nil, flow.BatchRef{}, err
	}
	l, err := trainer.NewLearner(model, trainer.LoRAConfig{})
	if err != nil {
		return nil, flow.BatchRef{}, err
	}
	res, err := l.Forward(ctx, proximalData(samples), trainer.Loss{Fn: trainer.LossFnCrossEntropy})
	if err != nil {
		return nil, flow.BatchRef{}, err
	}
	rows := make([]parquetbatch.Row, len(samples))
	for i := range samples {
		s, np := &samples[i], prompts[i]
		r := parquetbatch.Row{SampleID: int64(i + 1), GroupID: s.GroupID, TaskID: s.TaskID, Advantage: *s.Advantage, Reward: s.Reward}
		for t, id := range s.TokenIDs {
			if t < np {
				r.PromptIDs = append(r.PromptIDs, int32(id))
				continue
			}
			s.Logprobs[t] = res.Logprobs[i][t-1]
			r.CompletionIDs, r.LossMask = append(r.CompletionIDs, int32(id)), append(r.LossMask, 1)
			r.Logprobs, r.Versions = append(r.Logprobs, s.Logprobs[t]), append(r.Versions, 0)
		}
		rows[i] = r
	}
	if err := parquetbatch.Write(path, nil, rows); err != nil {
		return nil, flow.BatchRef{}, err
	}
	return samples, flow.BatchRef{URI: "file://" + path, Format: "parquet", Samples: len(rows)}, nil
}

// proximalData is the forward pass of every sample, weighted by its loss
// mask, as the train step sends it.
func proximalData(samples []trainer.Sample) []trainer.TokenDatum {
	data := make([]trainer.TokenDatum, len(samples))
	for i, s := range samples {
		n := len(s.TokenIDs) - 1
		w := make([]float32, n)
		for t := 1; t <= n; t++ {
			w[t-1] = float32(s.LossMask[t])
		}
		data[i] = trainer.TokenDatum{Input: s.TokenIDs[:n], Targets: s.TokenIDs[1:], Weights: w}
	}
	return data
}

// directRunner takes train steps with the learner in process.
type directRunner struct {
	base    *trainer.Model
	cfg     deployment.Trainer
	samples []trainer.Sample
	dir     string
	// cpu is the process's CPU time during the last step.
	cpu time.Duration
}

// step trains from step i−1's state (a fresh learner for step 0) and
// returns its wall time and summed loss.
func (r *directRunner) step(ctx context.Context, i int) (time.Duration, float64, error) {
	c := r.cfg
	loss, err := trainer.Masks{}.Apply(trainer.LossConfig{BehaviourWeightCap: c.BehaviourWeightCap})
	if err != nil {
		return 0, 0, err
	}
	lora := trainer.LoRAConfig{Rank: c.LoRA.Rank, Seed: uint64(c.LoRA.Seed), Attn: *c.LoRA.Attn, MLP: *c.LoRA.MLP, Unembed: *c.LoRA.Unembed}
	ppo := trainer.Loss{Fn: trainer.LossFnPPO, ClipLow: 1 - c.ClipLow, ClipHigh: 1 + c.ClipHigh}
	adam := trainer.AdamStep{LR: c.Adam.LR, Beta1: c.Adam.Beta1, Beta2: c.Adam.Beta2, Eps: c.Adam.Eps, WeightDecay: c.Adam.WeightDecay,
		ClipNorm: c.Adam.GradClipNorm}
	parts := trainer.SplitGroups(r.samples, c.MiniBatches)
	var flat []trainer.Sample
	for _, p := range parts {
		flat = append(flat, p...)
	}
	out := filepath.Join(r.dir, fmt.Sprint(i))
	if err := os.MkdirAll(out, 0o755); err != nil {
		return 0, 0, err
	}
	runtime.GC()
	start, cpu := time.Now(), processCPU()
	defer func() { r.cpu = processCPU() - cpu }()
	var l *trainer.Learner
	if i == 0 {
		l, err = trainer.NewLearner(r.base, lora)
	} else {
		l, err = trainer.LoadLearner(filepath.Join(r.dir, fmt.Sprint(i-1), "state.safetensors"), r.base, true)
	}
	if err != nil {
		return 0, 0, err
	}
	prox, err := l.Forward(ctx, proximalData(flat), trainer.Loss{Fn: trainer.LossFnCrossEntropy})
	if err != nil {
		return 0, 0, err
	}
	var sum float64
	offset := 0
	for _, part := range parts {
		res, err := l.ForwardBackward(ctx, ppoData(part, prox.Logprobs[offset:], loss), ppo)
		if err != nil {
			return 0, 0, err
		}
		offset += len(part)
		if _, err := l.OptimStep(adam); err != nil {
			return 0, 0, err
		}
		sum += res.LossSum
	}
	if err := l.SaveState(filepath.Join(out, "state.safetensors")); err != nil {
		return 0, 0, err
	}
	if err := l.WritePEFT(filepath.Join(out, "sampler"), benchTinkerBase); err != nil {
		return 0, 0, err
	}
	return time.Since(start), sum, nil
}

// ppoData is a minibatch's ppo datums as the train step builds them: weight
// 1/N on its N trained tokens, the ratio against the proximal policy, the
// behaviour weight folded into the advantage.
func ppoData(part []trainer.Sample, prox [][]float32, loss trainer.LossConfig) []trainer.TokenDatum {
	tokens := 0
	for _, s := range part {
		for _, m := range s.LossMask {
			tokens += int(m)
		}
	}
	inv := 1 / float64(tokens)
	data := make([]trainer.TokenDatum, len(part))
	for j, s := range part {
		n := len(s.TokenIDs) - 1
		d := trainer.TokenDatum{Input: s.TokenIDs[:n], Targets: s.TokenIDs[1:], Weights: make([]float32, n),
			Logprobs: make([]float32, n), Advantages: make([]float32, n)}
		for t := 1; t <= n; t++ {
			if s.LossMask[t] == 0 {
				continue
			}
			p := float64(prox[j][t-1])
			weight, _ := loss.OffPolicy(p, float64(s.Logprobs[t]))
			d.Weights[t-1], d.Logprobs[t-1], d.Advantages[t-1] = float32(inv), float32(p), float32(*s.Advantage*weight)
		}
		data[j] = d
	}
	return data
}

// apiRunner takes train steps through the Tinker API, each from the
// version the previous one made.
type apiRunner struct {
	tt    *activities.TinkerTraining
	cfg   deployment.Trainer
	batch flow.BatchRef
	dir   string
	prev  flow.CheckpointRef
	// profile, when set, is the prefix of the steps' CPU profiles.
	profile string
	// cpu is the process's CPU time during the last step: the client's
	// and the embedded server's.
	cpu time.Duration
}

func (r *apiRunner) step(ctx context.Context, i int) (time.Duration, float64, error) {
	const dep = "bench"
	tc := r.cfg
	in := flow.TrainBatchInput{Protocol: flow.TrainerProtocol, Deployment: dep, RunID: int64(i + 1), Batch: r.batch,
		Base:    flow.CheckpointRef{Version: r.prev.Version, URI: r.prev.URI, Model: benchTinkerBase},
		Output:  flow.OutputRef{Version: store.VersionID(dep, int64(i+1)), Dir: r.dir},
		Algo:    flow.TrainAlgorithm{Objective: trainer.ObjectiveGRPO},
		Trainer: &tc}
	runtime.GC()
	if r.profile != "" {
		f, err := os.Create(fmt.Sprintf("%s.%d", r.profile, i+1))
		if err != nil {
			return 0, 0, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return 0, 0, err
		}
		defer pprof.StopCPUProfile()
	}
	start, cpu := time.Now(), processCPU()
	out, err := r.tt.TrainBatch(ctx, in)
	r.cpu = processCPU() - cpu
	if err != nil {
		return 0, 0, err
	}
	r.prev = out.Checkpoint
	return time.Since(start), out.Loss, nil
}

// processCPU is the CPU time the process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// timeBatchRead is the median time of what the api's step does with the
// batch file before training: hash it and decode it.
func timeBatchRead(ref flow.BatchRef) (time.Duration, error) {
	path := strings.TrimPrefix(ref.URI, "file://")
	var ts []float64
	for range 3 {
		start := time.Now()
		f, err := os.Open(path)
		if err != nil {
			return 0, err
		}
		_, err = io.Copy(io.Discard, f) // stands for the sha256 pass
		f.Close()
		if err != nil {
			return 0, err
		}
		if _, _, err := parquetbatch.Read(path); err != nil {
			return 0, err
		}
		ts = append(ts, time.Since(start).Seconds())
	}
	return time.Duration(median(ts) * float64(time.Second)), nil
}

// countingTransport counts the bytes of request and response bodies and
// the time of each exchange, by route; a retrieve_future poll counts
// under the request it awaits (the client awaits one at a time).
type countingTransport struct {
	next   http.RoundTripper
	mu     sync.Mutex
	routes map[string]*routeStat
	// futures maps a request_id to the route that queued it.
	futures map[string]string
}

type routeStat struct {
	calls      int
	sent, recv int64
	busy       time.Duration
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	route := strings.TrimPrefix(req.URL.Path, "/api/v1/")
	switch {
	case strings.HasPrefix(route, "training_runs/"):
		route = "archive " + route[strings.LastIndex(route, "/")+1:]
	case route == "retrieve_future":
		var f tinker.RetrieveFutureRequest
		if body, err := req.GetBody(); err == nil {
			_ = json.NewDecoder(body).Decode(&f)
		}
		t.mu.Lock()
		route = t.futures[f.RequestID] + " (await)"
		t.mu.Unlock()
	}
	start := time.Now()
	resp, err := t.next.RoundTrip(req)
	sent := max(req.ContentLength, 0)
	if err != nil {
		t.add(route, sent, 0, time.Since(start))
		return nil, err
	}
	done := func(n int64) { t.add(route, sent, n, time.Since(start)) }
	if strings.HasPrefix(route, "archive") || strings.HasSuffix(route, "(await)") {
		resp.Body = &countingBody{ReadCloser: resp.Body, done: done}
		return resp, nil
	}
	// A submission's answer names its future.
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	done(int64(len(body)))
	var f tinker.FutureResponse
	if json.Unmarshal(body, &f) == nil && f.RequestID != "" {
		t.mu.Lock()
		t.futures[f.RequestID] = route
		t.mu.Unlock()
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, err
}

func (t *countingTransport) add(route string, sent, recv int64, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.routes[route]
	if st == nil {
		st = &routeStat{}
		t.routes[route] = st
	}
	st.calls++
	st.sent += sent
	st.recv += recv
	st.busy += d
}

// report prints each route's calls, bytes and time per step, and returns
// the bytes sent and received per step.
func (t *countingTransport) report(steps int, apiMean float64) (sent, recv int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	names := make([]string, 0, len(t.routes))
	for n := range t.routes {
		names = append(names, n)
	}
	slices.Sort(names)
	fmt.Println("api, per step (mean): route, calls, KiB sent, KiB received, ms from request to the answer's last byte")
	var busy time.Duration
	for _, n := range names {
		st := t.routes[n]
		sent, recv, busy = sent+st.sent, recv+st.recv, busy+st.busy
		fmt.Printf("  %-40s %5.1f %10.1f %10.1f %9.1f\n", n, float64(st.calls)/float64(steps),
			float64(st.sent)/1024/float64(steps), float64(st.recv)/1024/float64(steps), ms(st.busy)/float64(steps))
	}
	perStep := ms(busy) / float64(steps)
	fmt.Printf("  in HTTP exchanges %.1f ms a step; outside them (batch file, datums, JSON, tinker.json) %.1f ms of the mean step\n",
		perStep, math.Max(apiMean*1e3-perStep, 0))
	return sent / int64(steps), recv / int64(steps)
}

// countingBody reports the bytes read when the body is closed.
type countingBody struct {
	io.ReadCloser
	n    int64
	once sync.Once
	done func(int64)
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n += int64(n)
	return n, err
}

func (b *countingBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() { b.done(b.n) })
	return err
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
