// Package gatewaybench holds the gateway's whole-system benchmarks
// (`flywheel bench gateway`, `flywheel bench session-growth`): a real
// gateway on loopback, in front of the vLLM-dialect fake, capturing into a
// real Postgres, measured against a baseline run in the same process. It
// reads the gateway only through its exported API and its Prometheus
// registry, so none of it ships in the gateway package.
package gatewaybench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/gateway"
	"github.com/flywheel-ai/flywheel/gateway/capture"
	"github.com/flywheel-ai/flywheel/internal/fakevllm"
	"github.com/flywheel-ai/flywheel/store"
)

// BenchConfig sizes `flywheel bench gateway`.
type BenchConfig struct {
	// Pool is a migrated database the benchmark may write to.
	Pool *pgxpool.Pool
	// UpstreamLatency is the fixture upstream's fixed latency.
	UpstreamLatency time.Duration
	// RPS and Duration are the fixed-rate phase.
	RPS      int
	Duration time.Duration
	// Concurrency and MaxDuration are the maximum-throughput phase.
	Concurrency int
	MaxDuration time.Duration
	// CaptureWriters and CaptureDuration are the capture phase.
	CaptureWriters  int
	CaptureDuration time.Duration
	// CaptureConversationKB sizes the captured rows' conversation (and
	// their prompt token ids, about one per 4 bytes); 0 is a one-line
	// chat.
	CaptureConversationKB int
	// CaptureOnly skips the HTTP phases.
	CaptureOnly bool
	// Rounds is how many times the throughput and capture measurements
	// are repeated, alternating the systems; figures are medians (default 3).
	Rounds int
	Out    io.Writer
}

// BenchResult is the benchmark's figures; the JSON is its last line.
type BenchResult struct {
	AddedP50ms float64 `json:"added_p50_ms"`
	AddedP99ms float64 `json:"added_p99_ms"`
	// ThroughputRatio and CaptureRatio (and CaptureRatioSerial) are
	// medians of per-round ratios, each round measuring both systems back
	// to back.
	ThroughputRatio float64 `json:"throughput_ratio"`
	CaptureRatio    float64 `json:"capture_ratio"`

	BaselineP50ms        float64   `json:"baseline_p50_ms"`
	BaselineP99ms        float64   `json:"baseline_p99_ms"`
	GatewayP50ms         float64   `json:"gateway_p50_ms"`
	GatewayP99ms         float64   `json:"gateway_p99_ms"`
	ThroughputRatios     []float64 `json:"throughput_ratios"`
	BaselineMaxRPS       float64   `json:"baseline_max_rps"`
	GatewayMaxRPS        float64   `json:"gateway_max_rps"`
	BaselineErrors       int64     `json:"baseline_errors"`
	GatewayErrors        int64     `json:"gateway_errors"`
	CaptureBatchedRowsPS float64   `json:"capture_batched_rows_per_s"`
	CapturePerRowRowsPS  float64   `json:"capture_per_row_rows_per_s"`
	// CaptureSerialRowsPS is one writer committing one row at a time, the
	// fsync-bound floor; CaptureRatioSerial is batched ÷ that.
	CaptureSerialRowsPS float64 `json:"capture_serial_rows_per_s"`
	CaptureRatioSerial  float64 `json:"capture_ratio_vs_serial"`
	CaptureWriters      int     `json:"capture_writers"`
	CaptureMeanBatch    float64 `json:"capture_mean_batch"`
	CaptureRowBytes     int     `json:"capture_row_request_bytes"`
	UpstreamLatencyMS   float64 `json:"upstream_latency_ms"`
	RPS                 int     `json:"rps"`
	Concurrency         int     `json:"concurrency"`
	Rounds              int     `json:"rounds"`
}

// RunBench runs, in one process: a fixed-latency vLLM-like upstream, a bare
// Go reverse proxy to it (the baseline), and the gateway with capture on;
// first at a fixed rate (added latency), then closed-loop at maximum
// throughput; then group commit against per-row INSERTs.
func RunBench(ctx context.Context, bc BenchConfig) (*BenchResult, error) {
	logf := func(format string, args ...any) { fmt.Fprintf(bc.Out, format+"\n", args...) }
	if bc.Rounds < 1 {
		bc.Rounds = 3
	}
	res := &BenchResult{RPS: bc.RPS, Concurrency: bc.Concurrency, UpstreamLatencyMS: float64(bc.UpstreamLatency) / 1e6, Rounds: bc.Rounds}

	if err := store.EnsureTenant(ctx, bc.Pool, "bench"); err != nil {
		return nil, err
	}
	if !bc.CaptureOnly {
		if err := benchHTTP(ctx, bc, res, logf); err != nil {
			return nil, err
		}
	}
	if err := benchCapture(ctx, bc, res, logf); err != nil {
		return nil, err
	}
	// An interrupted run measured part of a phase: no figures at all
	// rather than ratios of zeros.
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("interrupted: %w", err)
	}
	logf("capture (%d writers, same pool, median of %d rounds, %d-byte requests): group commit %.0f rows/s (mean batch %.1f), per-row INSERT %.0f rows/s; one serial writer %.0f rows/s",
		bc.CaptureWriters, bc.Rounds, res.CaptureRowBytes, res.CaptureBatchedRowsPS, res.CaptureMeanBatch, res.CapturePerRowRowsPS, res.CaptureSerialRowsPS)
	return res, nil
}

// benchHTTP measures the baseline proxy and the gateway.
func benchHTTP(ctx context.Context, bc BenchConfig, res *BenchResult, logf func(string, ...any)) error {
	// The upstream is the named fake of vLLM's HTTP dialect: a real vLLM
	// needs a GPU and weights, which this machine has not.
	fx := &fakevllm.Fixture{Latency: bc.UpstreamLatency}
	upURL, stopUp, err := serveLocal("upstream", fx)
	if err != nil {
		return err
	}
	defer stopUp()
	target, _ := url.Parse(upURL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = &http.Transport{MaxIdleConnsPerHost: 1024, IdleConnTimeout: time.Minute}
	proxy.ErrorLog = log.New(io.Discard, "", 0) // overload shows up as latency and errors in the figures
	baseURL, stopBase, err := serveLocal("baseline", proxy)
	if err != nil {
		return err
	}
	defer stopBase()

	srv, gwURL, key, stopGW, err := benchGateway(ctx, bc.Pool, upURL, "flywheel bench gateway")
	if err != nil {
		return err
	}
	defer stopGW()

	body := []byte(`{"model":"fixture-model","messages":[{"role":"system","content":"You are a helpful agent."},{"role":"user","content":"Summarise the build log in one line."}],"max_tokens":32}`)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2048, MaxConnsPerHost: 0, IdleConnTimeout: time.Minute}}
	send := func(base string) (time.Duration, bool) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return time.Since(start), resp.StatusCode == http.StatusOK
	}

	// Warm both paths (connections, caches, the JIT-less Go runtime's pools).
	for range 200 {
		send(baseURL)
		send(gwURL)
	}
	// Interleave the two systems in short rounds so drift in machine load
	// hits both equally.
	var baseLat, gwLat []time.Duration
	capBefore := captureSnapshot(srv.reg)
	rounds := 4
	for r := 0; r < rounds; r++ {
		d := bc.Duration / time.Duration(rounds)
		l, e := fixedRate(ctx, bc.RPS, d, func() (time.Duration, bool) { return send(baseURL) })
		baseLat, res.BaselineErrors = append(baseLat, l...), res.BaselineErrors+e
		l, e = fixedRate(ctx, bc.RPS, d, func() (time.Duration, bool) { return send(gwURL) })
		gwLat, res.GatewayErrors = append(gwLat, l...), res.GatewayErrors+e
	}
	res.BaselineP50ms, res.BaselineP99ms = pct(baseLat, 0.50), pct(baseLat, 0.99)
	res.GatewayP50ms, res.GatewayP99ms = pct(gwLat, 0.50), pct(gwLat, 0.99)
	res.AddedP50ms, res.AddedP99ms = res.GatewayP50ms-res.BaselineP50ms, res.GatewayP99ms-res.BaselineP99ms
	meanBatch, meanCommit := captureSnapshot(srv.reg).since(capBefore)
	logf("fixed %d rps: baseline p50 %.3f ms p99 %.3f ms (%d errors); gateway p50 %.3f ms p99 %.3f ms (%d errors), its capture commits %.3f ms mean for %.1f rows mean",
		bc.RPS, res.BaselineP50ms, res.BaselineP99ms, res.BaselineErrors, res.GatewayP50ms, res.GatewayP99ms, res.GatewayErrors, meanCommit, meanBatch)

	// Alternate the systems round by round and keep medians: on a shared
	// machine one round can be hit by someone else's build.
	var baseMax, gwMax []float64
	capBefore = captureSnapshot(srv.reg)
	for range bc.Rounds {
		baseMax = append(baseMax, closedLoop(ctx, bc.Concurrency, bc.MaxDuration, func() bool { _, ok := send(baseURL); return ok }))
		gwMax = append(gwMax, closedLoop(ctx, bc.Concurrency, bc.MaxDuration, func() bool { _, ok := send(gwURL); return ok }))
	}
	res.BaselineMaxRPS, res.GatewayMaxRPS = median(baseMax), median(gwMax)
	res.ThroughputRatios = pairedRatios(gwMax, baseMax)
	res.ThroughputRatio = median(res.ThroughputRatios)
	meanBatch, meanCommit = captureSnapshot(srv.reg).since(capBefore)
	logf("max throughput (%d concurrent, median of %d rounds): baseline %.0f rps %v, gateway %.0f rps %v (capture commits %.3f ms mean for %.1f rows mean); per-round ratios %v",
		bc.Concurrency, bc.Rounds, res.BaselineMaxRPS, rounded(baseMax), res.GatewayMaxRPS, rounded(gwMax), meanCommit, meanBatch, twoDecimals(res.ThroughputRatios))
	return nil
}

// benchGateway serves, on loopback, a gateway capturing into pool in
// front of the upstream at upURL (serving "fixture-model"), and makes it
// a key of the bench tenant named name.
func benchGateway(ctx context.Context, pool *pgxpool.Pool, upURL, name string) (*benchServer, string, string, func(), error) {
	key, err := store.CreateKey(ctx, pool, "bench", "", name)
	if err != nil {
		return nil, "", "", nil, err
	}
	cfg := config.Default().Gateway
	cfg.UpstreamURL = upURL + "/v1"
	cfg.UpstreamModels = []string{"fixture-model"}
	cfg.RateLimitRPS = 0
	reg := prometheus.NewRegistry()
	srv, err := gateway.New(cfg, gateway.Deps{DB: pool, Logger: slog.New(slog.DiscardHandler), Registry: reg})
	if err != nil {
		return nil, "", "", nil, err
	}
	gwURL, stopGW, err := serveLocal("gateway", srv.Handler())
	if err != nil {
		srv.Close()
		return nil, "", "", nil, err
	}
	return &benchServer{Server: srv, reg: reg, cfg: cfg}, gwURL, key, func() { stopGW(); srv.Close() }, nil
}

// benchServer is a gateway under measurement, with its registry.
type benchServer struct {
	*gateway.Server
	reg prometheus.Gatherer
	cfg config.GatewayConfig
}

// benchCapture compares the committer with one autocommitted INSERT per
// row, both fed by the same number of concurrent writers.
func benchCapture(ctx context.Context, bc BenchConfig, res *BenchResult, logf func(string, ...any)) error {
	var seq atomic.Int64
	request, promptIDs := benchConversation(bc.CaptureConversationKB)
	res.CaptureRowBytes = len(request)
	// Each row opens its own session, as single-turn traffic does: an
	// agent session has one call in flight at a time, so concurrent
	// batches rarely wait on each other's session row locks.
	row := func() *store.NewInteraction {
		n := seq.Add(1)
		return &store.NewInteraction{TenantID: "bench", SessionID: fmt.Sprintf("bench-cap-%d", n), IdentityMode: "header",
			CompletionID: fmt.Sprintf("bench-cap-%d-%d", time.Now().UnixNano(), n), Protocol: "openai", Deployment: "fixture-model",
			ModelVersion: "fixture-model", Request: request,
			Response:       json.RawMessage(`{"message":{"role":"assistant","content":"echo: hello"},"finish_reason":"stop"}`),
			PromptTokenIDs: promptIDs, CompletionTokenIDs: []int32{9, 10, 11, 12}, Logprobs: []float32{-.1, -.2, -.3, -.4},
			PromptTokens: len(promptIDs), CompletionTokens: 4, FinishReason: "stop", Status: "ok"}
	}
	var failed atomic.Int64
	insert := func(c *capture.Committer) func() bool {
		return func() bool {
			var err error
			if c != nil {
				_, err = c.Submit(ctx, row())
			} else {
				_, err = store.InsertInteraction(ctx, bc.Pool, row())
			}
			if err != nil {
				failed.Add(1)
			}
			return err == nil
		}
	}
	// The per-row baseline is the obvious one: each row its own autocommit
	// transaction, the same writers on the same pool as group commit gets
	// (so Postgres may still merge concurrent WAL flushes for it). The
	// three methods alternate round by round; figures are medians.
	batchRows := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "bench_capture_batch_size", Buckets: prometheus.LinearBuckets(1, 8, 32)})
	var serials, perRows, batches []float64
	for range bc.Rounds {
		serials = append(serials, closedLoop(ctx, 1, bc.CaptureDuration, insert(nil)))
		perRows = append(perRows, closedLoop(ctx, bc.CaptureWriters, bc.CaptureDuration, insert(nil)))
		c, err := capture.New(ctx, bc.Pool, capture.Options{MaxBatch: config.Default().Gateway.CaptureBatchMax,
			Logger: slog.New(slog.DiscardHandler), Batch: batchRows})
		if err != nil {
			return err
		}
		batches = append(batches, closedLoop(ctx, bc.CaptureWriters, bc.CaptureDuration, insert(c)))
		c.Close()
	}
	serial, perRow, batched := median(serials), median(perRows), median(batches)
	logf("capture rounds (rows/s): serial %v, per-row %v, group commit %v", rounded(serials), rounded(perRows), rounded(batches))
	if n := failed.Load(); n > 0 {
		return fmt.Errorf("capture bench: %d inserts failed", n)
	}
	res.CapturePerRowRowsPS, res.CaptureBatchedRowsPS, res.CaptureSerialRowsPS = perRow, batched, serial
	res.CaptureWriters = bc.CaptureWriters
	res.CaptureRatio = median(pairedRatios(batches, perRows))
	res.CaptureRatioSerial = median(pairedRatios(batches, serials))
	res.CaptureMeanBatch = histogramMean(batchRows)
	return nil
}

// benchConversation is a captured request of about kb kilobytes of
// conversation (a one-line chat for 0) and its prompt token ids, about
// one per 4 bytes as a BPE tokenizer gives for English.
func benchConversation(kb int) (json.RawMessage, []int32) {
	if kb <= 0 {
		return json.RawMessage(`{"model":"fixture-model","messages":[{"role":"user","content":"hello"}]}`), []int32{1, 2, 3, 4, 5, 6, 7, 8}
	}
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var msgs []message
	for size, turn := 0, 0; size < kb*1024; turn++ {
		role := "user"
		if turn%2 == 1 {
			role = "assistant"
		}
		content := fmt.Sprintf("Turn %d: the build failed at step %d with exit code %d; retrying with a clean cache and verbose logs. ", turn, 7*turn, turn%3)
		msgs = append(msgs, message{Role: role, Content: strings.Repeat(content, 4)})
		size += len(msgs[len(msgs)-1].Content) + 30
	}
	request, _ := json.Marshal(map[string]any{"model": "fixture-model", "messages": msgs})
	ids := make([]int32, len(request)/4)
	for i := range ids {
		ids[i] = int32(1 + (i*7919)%50000)
	}
	return request, ids
}

// fixedRate sends at rps for d (open loop: a slow answer does not delay
// the next send) and returns the latencies of successful requests.
func fixedRate(ctx context.Context, rps int, d time.Duration, send func() (time.Duration, bool)) ([]time.Duration, int64) {
	n := int(d.Seconds() * float64(rps))
	interval := time.Second / time.Duration(rps)
	lat := make([]time.Duration, n)
	ok := make([]bool, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < n && ctx.Err() == nil; i++ {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat[i], ok[i] = send()
		}()
	}
	wg.Wait()
	var out []time.Duration
	var errs int64
	for i := range lat {
		if ok[i] {
			out = append(out, lat[i])
		} else {
			errs++
		}
	}
	return out, errs
}

// closedLoop runs workers calling f back to back for d; successes per s.
func closedLoop(ctx context.Context, workers int, d time.Duration, f func() bool) float64 {
	var done atomic.Int64
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) && ctx.Err() == nil {
				if f() {
					done.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return float64(done.Load()) / time.Since(start).Seconds()
}

// pairedRatios is num[i] / den[i] for the rounds measured back to back:
// the median of these is steadier on a shared machine than a ratio of
// medians, because load that hits one round hits both of its systems.
func pairedRatios(num, den []float64) []float64 {
	var out []float64
	for i := range min(len(num), len(den)) {
		if den[i] > 0 {
			out = append(out, num[i]/den[i])
		}
	}
	return out
}

// twoDecimals is xs rounded for the log lines.
func twoDecimals(xs []float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = math.Round(x*100) / 100
	}
	return out
}

// median of xs (the mean of the middle two for an even count).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

// rounded is xs to whole numbers, for the log lines.
func rounded(xs []float64) []int {
	out := make([]int, len(xs))
	for i, x := range xs {
		out[i] = int(x + 0.5)
	}
	return out
}

func pct(xs []time.Duration, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), xs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return float64(s[int(p*float64(len(s)-1))]) / 1e6
}

// serveLocal serves h on a loopback port. Its goroutines carry the pprof
// label system=name, so a CPU profile of the run (--cpuprofile) tells the
// systems apart: `go tool pprof -tagfocus system=gateway`.
func serveLocal(name string, h http.Handler) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("bench listen: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go pprof.Do(context.Background(), pprof.Labels("system", name), func(context.Context) { _ = srv.Serve(ln) })
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}
