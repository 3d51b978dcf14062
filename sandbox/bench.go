package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/moby/moby/client"
)

// BenchConfig sizes RunBench; zero values take the documented defaults.
type BenchConfig struct {
	// Provisions is the number of sequential cold creates timed; default 6.
	Provisions int
	// PoolSize is the warm pool size; default 4.
	PoolSize int
	// AcquireRounds: each round waits for a full pool and drains it; default 5.
	AcquireRounds int
	// AgentExecs and DockerExecs are the exec samples per path; default 200 and 30.
	AgentExecs, DockerExecs int
	// Forks is the number of sandboxes started from one snapshot; default 4.
	Forks int
	// Concurrent is how many sandboxes are started and held at once; default 16.
	Concurrent int
	// Progress receives human-readable lines; may be nil.
	Progress io.Writer
	// Logger defaults to a discarding logger.
	Logger *slog.Logger
}

// BenchResult is the JSON line of `flywheel bench sandbox`.
type BenchResult struct {
	AcquireP50MS    float64 `json:"acquire_p50_ms"`
	AcquireP99MS    float64 `json:"acquire_p99_ms"`
	AcquireSamples  int     `json:"acquire_samples"`
	ProvisionP50MS  float64 `json:"provision_p50_ms"`
	ProvisionP99MS  float64 `json:"provision_p99_ms"`
	SandboxesPerS   float64 `json:"sandboxes_per_s"`
	ExecAgentP50MS  float64 `json:"exec_agent_p50_ms"`
	ExecAgentP99MS  float64 `json:"exec_agent_p99_ms"`
	ExecDockerP50MS float64 `json:"exec_docker_p50_ms"`
	ExecDockerP99MS float64 `json:"exec_docker_p99_ms"`
	ExecSpeedup     float64 `json:"exec_speedup"`
	ForkMS          float64 `json:"fork_ms"`
	Forks           int     `json:"forks"`
	MaxConcurrent   int     `json:"max_concurrent"`
}

func (c *BenchConfig) fill() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Provisions, 6)
	def(&c.PoolSize, 4)
	def(&c.AcquireRounds, 5)
	def(&c.AgentExecs, 200)
	def(&c.DockerExecs, 30)
	def(&c.Forks, 4)
	def(&c.Concurrent, 16)
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// RunBench measures the sandbox layer on the engine behind cli with the base
// image: cold provisioning, warm-pool acquire, agent vs `docker exec`, fork,
// and concurrency. Every container it creates is removed before it returns.
func RunBench(ctx context.Context, cli *client.Client, cfg BenchConfig) (BenchResult, error) {
	cfg.fill()
	out := cfg.Progress
	var res BenchResult
	img, err := EnsureBaseImage(ctx, cli, BaseImageOptions{Logger: cfg.Logger})
	if err != nil {
		return res, err
	}
	fmt.Fprintf(out, "image %s\n", img.Ref)
	m, err := NewManager(cli, Config{Logger: cfg.Logger, ProvisionConcurrency: 4})
	if err != nil {
		return res, err
	}
	defer func() { _ = m.Close(context.WithoutCancel(ctx)) }()

	// Cold provisioning, one at a time.
	var prov []time.Duration
	for range cfg.Provisions {
		start := time.Now()
		sb, err := m.Create(ctx, img)
		if err != nil {
			return res, err
		}
		prov = append(prov, time.Since(start))
		if err := m.Release(ctx, sb); err != nil {
			return res, err
		}
	}
	res.ProvisionP50MS, res.ProvisionP99MS = pct(prov, 50), pct(prov, 99)
	fmt.Fprintf(out, "provision: p50 %.1f ms over %d\n", res.ProvisionP50MS, len(prov))

	// Exec: the agent against docker exec on the same sandbox.
	sb, err := m.Create(ctx, img)
	if err != nil {
		return res, err
	}
	agentLat, err := timeExecs(ctx, cfg.AgentExecs, func() (ExecResult, error) { return sb.Exec(ctx, ExecRequest{Cmd: "true"}) })
	if err != nil {
		return res, err
	}
	dockerLat, err := timeExecs(ctx, cfg.DockerExecs, func() (ExecResult, error) { return sb.ExecDocker(ctx, ExecRequest{Cmd: "true"}) })
	if err != nil {
		return res, err
	}
	res.ExecAgentP50MS, res.ExecAgentP99MS = pct(agentLat, 50), pct(agentLat, 99)
	res.ExecDockerP50MS, res.ExecDockerP99MS = pct(dockerLat, 50), pct(dockerLat, 99)
	if res.ExecAgentP50MS > 0 {
		res.ExecSpeedup = res.ExecDockerP50MS / res.ExecAgentP50MS
	}
	fmt.Fprintf(out, "exec: agent p50 %.2f ms, docker exec p50 %.1f ms, speedup %.1fx\n", res.ExecAgentP50MS, res.ExecDockerP50MS, res.ExecSpeedup)

	// Fork: snapshot the prepared sandbox and start N copies.
	if err := sb.WriteFile(ctx, "prepared.txt", []byte("state"), 0); err != nil {
		return res, err
	}
	start := time.Now()
	snap, forks, err := m.Fork(ctx, sb, cfg.Forks)
	if err != nil {
		return res, err
	}
	res.ForkMS, res.Forks = ms(time.Since(start)), len(forks)
	for _, f := range forks {
		if r, err := f.Exec(ctx, ExecRequest{Cmd: "cat prepared.txt"}); err != nil || string(r.Stdout) != "state" {
			return res, fmt.Errorf("bench: fork lost the prepared state: %v", err)
		}
		_ = m.Release(ctx, f)
	}
	_ = m.Release(ctx, sb)
	_ = m.RemoveSnapshot(ctx, snap)
	fmt.Fprintf(out, "fork: %d sandboxes from a snapshot in %.0f ms\n", res.Forks, res.ForkMS)

	// Throughput and concurrency: start Concurrent sandboxes at once, hold
	// them all, check every one answers.
	start = time.Now()
	held := make([]*Sandbox, cfg.Concurrent)
	errs := make([]error, cfg.Concurrent)
	var wg sync.WaitGroup
	for i := range cfg.Concurrent {
		wg.Go(func() { held[i], errs[i] = m.Create(ctx, img) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	for i, sb := range held {
		if errs[i] != nil {
			continue
		}
		if _, err := sb.Exec(ctx, ExecRequest{Cmd: "true"}); err == nil {
			res.MaxConcurrent++
		}
	}
	res.SandboxesPerS = float64(res.MaxConcurrent) / elapsed.Seconds()
	for _, sb := range held {
		if sb != nil {
			_ = m.Release(ctx, sb)
		}
	}
	fmt.Fprintf(out, "concurrency: %d/%d live at once, %.2f sandboxes/s\n", res.MaxConcurrent, cfg.Concurrent, res.SandboxesPerS)
	if err := errors.Join(errs...); err != nil && res.MaxConcurrent == 0 {
		return res, err
	}

	// Warm pool: wait until full, drain it, repeat.
	if err := m.StartPool(img, cfg.PoolSize); err != nil {
		return res, err
	}
	var acq []time.Duration
	var releases sync.WaitGroup
	for round := range cfg.AcquireRounds {
		deadline := time.Now().Add(3 * time.Minute)
		for m.PoolStats(img).Ready < cfg.PoolSize {
			if time.Now().After(deadline) {
				return res, fmt.Errorf("bench: pool did not refill in round %d: %v", round, m.PoolStats(img).LastError)
			}
			select {
			case <-ctx.Done():
				return res, ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
		var got []*Sandbox
		for range cfg.PoolSize {
			start := time.Now()
			sb, err := m.Acquire(ctx, img)
			if err != nil {
				return res, err
			}
			acq = append(acq, time.Since(start))
			got = append(got, sb)
		}
		// Removal runs while the pool refills, as it would in service, but
		// finishes before the bench returns so nothing is left behind.
		for _, sb := range got {
			releases.Go(func() { _ = m.Release(context.WithoutCancel(ctx), sb) })
		}
	}
	releases.Wait()
	res.AcquireP50MS, res.AcquireP99MS, res.AcquireSamples = pct(acq, 50), pct(acq, 99), len(acq)
	fmt.Fprintf(out, "acquire (warm pool of %d): p50 %.3f ms, p99 %.3f ms over %d\n", cfg.PoolSize, res.AcquireP50MS, res.AcquireP99MS, len(acq))
	return res, nil
}

func timeExecs(ctx context.Context, n int, f func() (ExecResult, error)) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	for range n {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		start := time.Now()
		r, err := f()
		if err != nil {
			return nil, err
		}
		if r.ExitCode != 0 {
			return nil, fmt.Errorf("bench: exec exited %d: %s", r.ExitCode, r.Stderr)
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// pct is the nearest-rank percentile in milliseconds.
func pct(ds []time.Duration, p int) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	idx := (p*len(s) + 99) / 100
	idx = min(max(idx-1, 0), len(s)-1)
	return ms(s[idx])
}
