package modelserver_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/inference/weightsync"
	"github.com/flywheel-ai/flywheel/modelserver"
	"github.com/flywheel-ai/flywheel/trainer"
	"github.com/flywheel-ai/flywheel/upstream"
)

// BenchmarkWeightSwap measures a release's weight swap on the policy's
// model server at the policy's real size: weight sync loads the next
// version, the clients' route moves to it, and the version before the
// previous one (drained by then, as a release's sync leaves it) is
// unloaded, while 4 clients send requests through the gateway's upstream
// client. It reports the swap time, the requests that failed (the target
// is 0), and the clients' median latency during the swaps as a ratio of
// their median in a phase without swaps, measured first in the same run.
func BenchmarkWeightSwap(b *testing.B) {
	ctx := context.Background()
	paths := savedVersions(b, b.N+1)
	base, err := trainer.NewModel(trainer.ModelConfig{}, 1000)
	if err != nil {
		b.Fatal(err)
	}
	srv, err := modelserver.New(base, 0, modelserver.Config{Name: served, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	h := httptest.NewServer(srv)
	defer h.Close()
	ws, err := weightsync.New(deployment.WeightSync{Kind: deployment.WeightSyncVLLMLoRA}, h.URL+"/v1", "", nil)
	if err != nil {
		b.Fatal(err)
	}
	name := func(v int) string { return served + "@v" + strconv.Itoa(v) }
	if err := ws.Load(ctx, name(1), paths[1]); err != nil {
		b.Fatal(err)
	}

	var (
		route          atomic.Value // the version the clients ask for
		failed         atomic.Int64
		mu             sync.Mutex
		quiet, swapped []time.Duration
		swapping       atomic.Bool
		stop           = make(chan struct{})
		wg             sync.WaitGroup
	)
	route.Store(name(1))
	for range 4 {
		client, err := upstream.New(upstream.Config{BaseURL: h.URL + "/v1", Model: served, Dialect: deployment.DialectVLLM, VersionsByName: true})
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				during := swapping.Load()
				start := time.Now()
				_, err := client.Complete(ctx, &inference.Request{Model: served, Version: route.Load().(string), MaxTokens: 16,
					Messages: []inference.Message{{Role: inference.RoleUser, Content: "what is 17 + 25?"}}})
				took := time.Since(start)
				if err != nil {
					failed.Add(1)
					continue
				}
				mu.Lock()
				if during {
					swapped = append(swapped, took)
				} else {
					quiet = append(quiet, took)
				}
				mu.Unlock()
			}
		}()
	}
	time.Sleep(500 * time.Millisecond) // the phase without swaps

	swapping.Store(true)
	b.ResetTimer()
	for i := 1; i <= b.N; i++ {
		next := name(i + 1)
		if err := ws.Load(ctx, next, paths[i+1]); err != nil {
			b.Fatal(err)
		}
		route.Store(next)
		// The version before the one just replaced has drained: a
		// request routed to it was sent a whole swap ago.
		if i > 1 {
			if err := ws.Unload(ctx, name(i-1)); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	time.Sleep(100 * time.Millisecond) // requests routed before the last swap finish
	close(stop)
	wg.Wait()
	b.ReportMetric(float64(failed.Load()), "failed-requests")
	if len(quiet) > 0 && len(swapped) > 0 {
		b.ReportMetric(float64(median(swapped))/float64(median(quiet)), "latency-during/quiet")
	}
}

// savedVersions saves versions 1 to n of a policy; paths[v] is version v's.
func savedVersions(b *testing.B, n int) []string {
	dir := trainer.CheckpointDir{Dir: b.TempDir()}
	paths := make([]string, n+1)
	for v := 1; v <= n; v++ {
		m, err := trainer.NewModel(trainer.ModelConfig{}, uint64(v))
		if err != nil {
			b.Fatal(err)
		}
		if paths[v], err = dir.Save(m, int64(v), nil); err != nil {
			b.Fatal(err)
		}
	}
	return paths
}

func median(xs []time.Duration) time.Duration {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkCompleteOverHTTP is what serving the policy through its model
// server costs against calling the engine in process (the path the
// gateway took before): the same greedy requests, alternated, through the
// gateway's upstream client and HTTP, and straight into a trainer.Engine
// holding the same weights. It reports each path's time per call and the
// ratio.
func BenchmarkCompleteOverHTTP(b *testing.B) {
	ctx := context.Background()
	m, err := trainer.NewModel(trainer.ModelConfig{}, 7)
	if err != nil {
		b.Fatal(err)
	}
	srv, err := modelserver.New(m, 0, modelserver.Config{Name: served, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	h := httptest.NewServer(srv)
	defer h.Close()
	client, err := upstream.New(upstream.Config{BaseURL: h.URL + "/v1", Model: served, Dialect: deployment.DialectVLLM})
	if err != nil {
		b.Fatal(err)
	}
	engine, err := trainer.NewEngine(m, 0, trainer.EngineConfig{Name: served, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	zero := 0.0
	req := func() *inference.Request {
		return &inference.Request{Model: served, MaxTokens: 16, Temperature: &zero,
			Messages: []inference.Message{{Role: inference.RoleUser, Content: "reverse: q w e r"}}}
	}
	var direct, overHTTP time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if _, err := engine.Complete(ctx, req()); err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		if _, err := client.Complete(ctx, req()); err != nil {
			b.Fatal(err)
		}
		direct, overHTTP = direct+mid.Sub(start), overHTTP+time.Since(mid)
	}
	b.ReportMetric(float64(direct.Microseconds())/float64(b.N), "direct-µs/call")
	b.ReportMetric(float64(overHTTP.Microseconds())/float64(b.N), "http-µs/call")
	b.ReportMetric(float64(overHTTP)/float64(direct), "http/direct")
}
