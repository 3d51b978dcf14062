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
	// Image is what sandboxes are made from; default the base image.
	Image *Image
	// Provisions is the number of sequential cold creates timed: the
	// baseline of every ratio; default 6.
	Provisions int
	// PoolSize is the warm pool size under load; default 4.
	PoolSize int
	// Concurrent is the number of rollouts in flight under load; default 16.
	Concurrent int
	// Rounds is how many rollouts each of them runs; default 3.
	Rounds int
	// Hold is how long a rollout keeps its sandbox, running commands;
	// default 1s.
	Hold time.Duration
	// Resets is the number of used sandboxes reset to clean; default 6.
	Resets int
	// AgentExecs and DockerExecs are the exec samples per path; default 200 and 30.
	AgentExecs, DockerExecs int
	// Forks is the number of sandboxes started from one snapshot; default 4.
	Forks int
	// Progress receives human-readable lines; may be nil.
	Progress io.Writer
	// Logger defaults to a discarding logger.
	Logger *slog.Logger
}

// BenchResult is the JSON line of `flywheel bench sandbox`. Every figure is
// wall time on this machine; the ratios compare figures of the same run.
type BenchResult struct {
	Image string `json:"image"`
	// CreateP50MS is a cold create: container create, start, agent
	// handshake, /workspace unpacked; one at a time, nothing else running.
	CreateP50MS float64 `json:"create_p50_ms"`
	CreateP99MS float64 `json:"create_p99_ms"`
	// ReadyP50MS is the time from a rollout's request to a clean sandbox
	// that answered a ping, with Concurrent rollouts in flight and the pool
	// refilling behind them; ReadyVsCreate is its ratio to CreateP50MS.
	ReadyP50MS    float64 `json:"ready_p50_ms"`
	ReadyP99MS    float64 `json:"ready_p99_ms"`
	ReadySamples  int     `json:"ready_samples"`
	ReadyVsCreate float64 `json:"ready_vs_create"`
	// ReadyConcurrent rollouts were in flight, MaxLive sandboxes were
	// alive at the peak (held plus warm).
	ReadyConcurrent int `json:"ready_concurrent"`
	MaxLive         int `json:"max_live"`
	// Recycled releases went back to the pool reset, Removed did not (no
	// room in its queue, or the reset failed).
	Recycled int `json:"recycled"`
	Removed  int `json:"removed"`
	// ResetP50MS returns a used sandbox to clean (Sandbox.Reset); ResetSpeedup
	// is CreateP50MS over it.
	ResetP50MS   float64 `json:"reset_p50_ms"`
	ResetP99MS   float64 `json:"reset_p99_ms"`
	ResetSpeedup float64 `json:"reset_speedup"`
	// Exec through the agent against `docker exec` on one sandbox.
	ExecAgentP50MS  float64 `json:"exec_agent_p50_ms"`
	ExecAgentP99MS  float64 `json:"exec_agent_p99_ms"`
	ExecDockerP50MS float64 `json:"exec_docker_p50_ms"`
	ExecDockerP99MS float64 `json:"exec_docker_p99_ms"`
	ExecSpeedup     float64 `json:"exec_speedup"`
	// ForkMS is one snapshot plus Forks sandboxes started from it.
	ForkMS float64 `json:"fork_ms"`
	Forks  int     `json:"forks"`
}

func (c *BenchConfig) fill() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Provisions, 6)
	def(&c.PoolSize, 4)
	def(&c.Concurrent, 16)
	def(&c.Rounds, 3)
	def(&c.Resets, 6)
	def(&c.AgentExecs, 200)
	def(&c.DockerExecs, 30)
	def(&c.Forks, 4)
	if c.Hold <= 0 {
		c.Hold = time.Second
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// RunBench measures what a rollout feels of the sandbox layer on the engine
// behind cli: cold create (the baseline), request-to-ready under a rollout
// load with pool refill, reset of a used sandbox against a create, agent
// exec against `docker exec`, and fork. Every container and snapshot it
// creates is removed before it returns.
func RunBench(ctx context.Context, cli *client.Client, cfg BenchConfig) (BenchResult, error) {
	cfg.fill()
	out := cfg.Progress
	var res BenchResult
	var img Image
	if cfg.Image != nil {
		img = *cfg.Image
	} else {
		var err error
		if img, err = EnsureBaseImage(ctx, cli, BaseImageOptions{Logger: cfg.Logger}); err != nil {
			return res, err
		}
	}
	res.Image = img.Ref
	fmt.Fprintf(out, "image %s\n", img.Ref)
	m, err := NewManager(cli, Config{Logger: cfg.Logger, ProvisionConcurrency: 4})
	if err != nil {
		return res, err
	}
	defer func() { _ = m.Close(context.WithoutCancel(ctx)) }()

	if err := benchCreate(ctx, m, img, cfg, &res); err != nil {
		return res, err
	}
	if err := benchReady(ctx, m, img, cfg, &res); err != nil {
		return res, err
	}
	if err := benchReset(ctx, m, img, cfg, &res); err != nil {
		return res, err
	}
	if err := benchExecAndFork(ctx, m, img, cfg, &res); err != nil {
		return res, err
	}
	return res, nil
}

// benchCreate times cold creates one at a time: the baseline.
func benchCreate(ctx context.Context, m *Manager, img Image, cfg BenchConfig, res *BenchResult) error {
	var lat []time.Duration
	for range cfg.Provisions {
		start := time.Now()
		sb, err := m.Create(ctx, img)
		if err != nil {
			return err
		}
		lat = append(lat, time.Since(start))
		if err := m.Release(ctx, sb); err != nil {
			return err
		}
	}
	res.CreateP50MS, res.CreateP99MS = pct(lat, 50), pct(lat, 99)
	fmt.Fprintf(cfg.Progress, "create (cold, one at a time): p50 %.0f ms, p99 %.0f ms over %d\n", res.CreateP50MS, res.CreateP99MS, len(lat))
	return nil
}

// benchReady runs Concurrent rollouts at once, Rounds each, against a warm
// pool of PoolSize that refills in the background. A rollout requests a
// sandbox, waits until it answers a ping (the SWE activity does the same),
// runs commands for Hold and releases it. The pool is full at the start,
// as in service.
func benchReady(ctx context.Context, m *Manager, img Image, cfg BenchConfig, res *BenchResult) error {
	if err := m.StartPool(img, cfg.PoolSize); err != nil {
		return err
	}
	if err := waitPoolFull(ctx, m, img, cfg.PoolSize); err != nil {
		return err
	}
	var (
		mu      sync.Mutex
		lat     []time.Duration
		held    int
		maxLive int
		errs    = make([]error, cfg.Concurrent)
		wg      sync.WaitGroup
	)
	for w := range cfg.Concurrent {
		wg.Go(func() {
			for range cfg.Rounds {
				start := time.Now()
				sb, err := m.Acquire(ctx, img)
				if err == nil {
					_, err = sb.Ping(ctx)
				}
				if err != nil {
					errs[w] = err
					return
				}
				ready := time.Since(start)
				mu.Lock()
				lat = append(lat, ready)
				held++
				maxLive = max(maxLive, held+m.PoolStats(img).Ready)
				mu.Unlock()
				for end := time.Now().Add(cfg.Hold); time.Now().Before(end) && ctx.Err() == nil; {
					if _, err := sb.Exec(ctx, ExecRequest{Cmd: "ls -la /workspace >/dev/null; sleep 0.1"}); err != nil {
						errs[w] = err
						break
					}
				}
				mu.Lock()
				held--
				mu.Unlock()
				if err := m.Release(context.WithoutCancel(ctx), sb); err != nil && errs[w] == nil {
					errs[w] = err
				}
				if errs[w] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bench ready: %w", err)
	}
	res.ReadyP50MS, res.ReadyP99MS, res.ReadySamples = pct(lat, 50), pct(lat, 99), len(lat)
	st := m.PoolStats(img)
	res.ReadyConcurrent, res.MaxLive, res.Recycled, res.Removed = cfg.Concurrent, maxLive, st.Recycled, st.Removed
	if res.CreateP50MS > 0 {
		res.ReadyVsCreate = res.ReadyP50MS / res.CreateP50MS
	}
	fmt.Fprintf(cfg.Progress, "ready (%d rollouts in flight, pool of %d refilling, released sandboxes reset and recycled): p50 %.0f ms, p99 %.0f ms over %d = %.2fx a quiet create; %d sandboxes alive at the peak; %d releases recycled, %d removed\n",
		cfg.Concurrent, cfg.PoolSize, res.ReadyP50MS, res.ReadyP99MS, len(lat), res.ReadyVsCreate, maxLive, st.Recycled, st.Removed)
	return nil
}

func waitPoolFull(ctx context.Context, m *Manager, img Image, size int) error {
	deadline := time.Now().Add(3 * time.Minute)
	for m.PoolStats(img).Ready < size {
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: pool did not fill: %v", m.PoolStats(img).LastError)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// dirty is what a rollout leaves behind: changed and new files in every
// writable place and a process that escaped its command.
const dirty = "for d in /workspace /tmp /home/sandbox; do mkdir -p $d/junk && dd if=/dev/urandom of=$d/junk/blob bs=64k count=16 2>/dev/null; done; " +
	"find /workspace -type f -not -path '*/.git/*' | head -n 20 | while read f; do echo changed >> \"$f\"; done; " +
	"setsid sleep 600 >/dev/null 2>&1 &"

// benchReset times Sandbox.Reset of a used sandbox, against benchCreate.
func benchReset(ctx context.Context, m *Manager, img Image, cfg BenchConfig, res *BenchResult) error {
	sb, err := m.Create(ctx, img)
	if err != nil {
		return err
	}
	defer func() { _ = m.Release(context.WithoutCancel(ctx), sb) }()
	var lat []time.Duration
	for range cfg.Resets {
		r, err := sb.Exec(ctx, ExecRequest{Cmd: dirty, KeepStrays: true})
		if err != nil {
			return err
		}
		if r.ExitCode != 0 {
			return fmt.Errorf("bench reset: dirtying exited %d: %s", r.ExitCode, r.Stderr)
		}
		start := time.Now()
		if err := sb.Reset(ctx); err != nil {
			return err
		}
		lat = append(lat, time.Since(start))
		if r, err := sb.Exec(ctx, ExecRequest{Cmd: "test ! -e /workspace/junk && test ! -e /tmp/junk"}); err != nil || r.ExitCode != 0 {
			return fmt.Errorf("bench reset: sandbox not clean after reset: %v", err)
		}
	}
	res.ResetP50MS, res.ResetP99MS = pct(lat, 50), pct(lat, 99)
	if res.ResetP50MS > 0 {
		res.ResetSpeedup = res.CreateP50MS / res.ResetP50MS
	}
	fmt.Fprintf(cfg.Progress, "reset (used to clean): p50 %.0f ms, p99 %.0f ms over %d; create/reset %.1fx\n", res.ResetP50MS, res.ResetP99MS, len(lat), res.ResetSpeedup)
	return nil
}

// benchExecAndFork times the agent against docker exec on one sandbox,
// then snapshots it and starts Forks copies.
func benchExecAndFork(ctx context.Context, m *Manager, img Image, cfg BenchConfig, res *BenchResult) error {
	out := cfg.Progress
	sb, err := m.Create(ctx, img)
	if err != nil {
		return err
	}
	defer func() { _ = m.Release(context.WithoutCancel(ctx), sb) }()
	agentLat, err := timeExecs(ctx, cfg.AgentExecs, func() (ExecResult, error) { return sb.Exec(ctx, ExecRequest{Cmd: "true"}) })
	if err != nil {
		return err
	}
	dockerLat, err := timeExecs(ctx, cfg.DockerExecs, func() (ExecResult, error) { return sb.ExecDocker(ctx, ExecRequest{Cmd: "true"}) })
	if err != nil {
		return err
	}
	res.ExecAgentP50MS, res.ExecAgentP99MS = pct(agentLat, 50), pct(agentLat, 99)
	res.ExecDockerP50MS, res.ExecDockerP99MS = pct(dockerLat, 50), pct(dockerLat, 99)
	if res.ExecAgentP50MS > 0 {
		res.ExecSpeedup = res.ExecDockerP50MS / res.ExecAgentP50MS
	}
	fmt.Fprintf(out, "exec: agent p50 %.2f ms, docker exec p50 %.1f ms, speedup %.1fx\n", res.ExecAgentP50MS, res.ExecDockerP50MS, res.ExecSpeedup)

	if err := sb.WriteFile(ctx, "prepared.txt", []byte("state"), 0); err != nil {
		return err
	}
	start := time.Now()
	snap, forks, err := m.Fork(ctx, sb, cfg.Forks)
	if err != nil {
		return err
	}
	res.ForkMS, res.Forks = ms(time.Since(start)), len(forks)
	defer func() { _ = m.RemoveSnapshot(context.WithoutCancel(ctx), snap) }()
	for _, f := range forks {
		r, err := f.Exec(ctx, ExecRequest{Cmd: "cat prepared.txt"})
		_ = m.Release(ctx, f)
		if err != nil || string(r.Stdout) != "state" {
			return fmt.Errorf("bench: fork lost the prepared state: %v", err)
		}
	}
	fmt.Fprintf(out, "fork: %d sandboxes from a snapshot in %.0f ms\n", res.Forks, res.ForkMS)
	return nil
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
