package faults

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// SoakConfig sizes `flywheel bench soak`; zero values take the defaults.
type SoakConfig struct {
	Bin, TemporalCLI string
	// Capacity is how long the closed-loop capacity measurement runs with
	// CapacityClients agents (defaults 15 s, 32).
	Capacity        time.Duration
	CapacityClients int
	// Load is the share of the measured capacity the soak offers, open
	// loop (default 0.5), for Duration (default 20 min), sampled every
	// Sample (default 30 s).
	Load     float64
	Duration time.Duration
	Sample   time.Duration
	Keep     bool
	Out      io.Writer
}

// SoakSample is the state of the stack at one moment of the soak.
type SoakSample struct {
	Minute     float64 `json:"minute"`
	Acked      int64   `json:"acked"`
	Errors     int64   `json:"errors"`
	P50MS      float64 `json:"p50_ms"`
	P99MS      float64 `json:"p99_ms"`
	RSSMB      float64 `json:"rss_mb"`
	Goroutines int     `json:"goroutines"`
	PGConns    int     `json:"pg_conns"`
	// RowsPerInteraction is every live row of the database's tables over
	// the interactions: what one captured call costs in rows, all told.
	RowsPerInteraction float64 `json:"rows_per_interaction"`
}

// SoakResult is the soak's figures; the JSON is its last line. Slopes are
// least-squares fits over the samples after the first fifth (warm-up),
// per hour.
type SoakResult struct {
	CapacityRPS             float64        `json:"capacity_rps"`
	OfferedRPS              float64        `json:"offered_rps"`
	AckedRPS                float64        `json:"acked_rps"`
	Errors                  int64          `json:"errors"`
	Statuses                map[string]int `json:"statuses"`
	Dropped                 int64          `json:"dropped"`
	RSSMBPerHour            float64        `json:"rss_mb_per_hour"`
	GoroutinesPerHour       float64        `json:"goroutines_per_hour"`
	PGConnsPerHour          float64        `json:"pg_conns_per_hour"`
	RowsPerInteractionSlope float64        `json:"rows_per_interaction_per_hour"`
	Samples                 []SoakSample   `json:"samples"`
}

func (c *SoakConfig) fill() {
	if c.Capacity <= 0 {
		c.Capacity = 15 * time.Second
	}
	if c.CapacityClients <= 0 {
		c.CapacityClients = 32
	}
	if c.Load <= 0 {
		c.Load = 0.5
	}
	if c.Duration <= 0 {
		c.Duration = 20 * time.Minute
	}
	if c.Sample <= 0 {
		c.Sample = 30 * time.Second
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
}

// RunSoak measures the stack's capacity, then offers a share of it for a
// long time and samples what the process and Postgres hold.
func RunSoak(ctx context.Context, cfg SoakConfig) (*SoakResult, error) {
	cfg.fill()
	logf := func(format string, args ...any) { fmt.Fprintf(cfg.Out, format+"\n", args...) }
	st, err := startStack(ctx, "flywheel-soak-", cfg.Bin, cfg.TemporalCLI)
	if err != nil {
		return nil, err
	}
	defer st.close(cfg.Keep)

	// Capacity: closed loop, no pause between calls.
	ld := startLoad(st, Config{Clients: cfg.CapacityClients, Think: time.Nanosecond}, "capacity", false)
	sleep(ctx, cfg.Capacity)
	ld.stop()
	res := &SoakResult{CapacityRPS: float64(len(ld.acked)) / cfg.Capacity.Seconds()}
	res.OfferedRPS = res.CapacityRPS * cfg.Load
	logf("capacity %.0f calls/s with %d closed-loop agents; offering %.0f calls/s for %s", res.CapacityRPS, cfg.CapacityClients, res.OfferedRPS, cfg.Duration)
	if res.OfferedRPS < 1 {
		return nil, fmt.Errorf("capacity %.2f calls/s is too low to soak", res.CapacityRPS)
	}

	// The soak: open loop in sessions, an agent's 4 calls one after the
	// other (a session's calls overlapping would end it under its own
	// calls); sessions start at a quarter of the offered call rate, at most
	// 64 at once.
	httpc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer httpc.CloseIdleConnections()
	sl := &load{tenant: "default", prefix: fmt.Sprintf("soak-%d-", time.Now().UnixNano()), acked: map[string]bool{}, statuses: map[string]int{}}
	var (
		wg        sync.WaitGroup
		inflight  = make(chan struct{}, 64)
		dropped   atomic.Int64
		latMu     sync.Mutex
		latencies []time.Duration
	)
	start := time.Now()
	tick := time.NewTicker(time.Duration(4 * float64(time.Second) / res.OfferedRPS))
	defer tick.Stop()
	next := time.Now().Add(cfg.Sample)
	soakCtx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	for n := 0; soakCtx.Err() == nil; {
		select {
		case <-soakCtx.Done():
		case <-tick.C:
			select {
			case inflight <- struct{}{}:
				session := fmt.Sprintf("%s%d", sl.prefix, n)
				n++
				wg.Add(1)
				go func() {
					defer func() { <-inflight; wg.Done() }()
					for turn := 0; turn < 4; turn++ {
						t := time.Now()
						sl.call(soakCtx, httpc, st, session, turn, turn == 3)
						latMu.Lock()
						latencies = append(latencies, time.Since(t))
						latMu.Unlock()
					}
				}()
			default:
				dropped.Add(4) // the stack fell behind: not offered
			}
		}
		if time.Now().After(next) {
			next = next.Add(cfg.Sample)
			latMu.Lock()
			window := latencies
			latencies = nil
			latMu.Unlock()
			s := sample(ctx, st, sl, start, window)
			res.Samples = append(res.Samples, s)
			logf("%5.1f min: acknowledged %7d, errors %d, p50 %.1f ms p99 %.1f ms, RSS %.0f MB, goroutines %d, Postgres connections %d, rows per interaction %.2f",
				s.Minute, s.Acked, s.Errors, s.P50MS, s.P99MS, s.RSSMB, s.Goroutines, s.PGConns, s.RowsPerInteraction)
		}
	}
	wg.Wait()
	sl.mu.Lock()
	res.AckedRPS = float64(len(sl.acked)) / time.Since(start).Seconds()
	res.Errors = int64(sl.sent - len(sl.acked))
	res.Statuses = sl.statuses
	sl.mu.Unlock()
	res.Dropped = dropped.Load()
	res.fitSlopes()
	logf("offered %.0f/s, acknowledged %.1f/s, statuses %v, %d not offered (behind); slopes per hour after warm-up: RSS %+.1f MB, goroutines %+.1f, Postgres connections %+.2f, rows per interaction %+.3f",
		res.OfferedRPS, res.AckedRPS, res.Statuses, res.Dropped, res.RSSMBPerHour, res.GoroutinesPerHour, res.PGConnsPerHour, res.RowsPerInteractionSlope)
	return res, nil
}

// fitSlopes fits the per-hour slopes over the samples after the first
// fifth (warm-up).
func (res *SoakResult) fitSlopes() {
	warm := len(res.Samples) / 5
	tail := res.Samples[warm:]
	fit := func(f func(SoakSample) float64) float64 {
		xs, ys := make([]float64, len(tail)), make([]float64, len(tail))
		for i, s := range tail {
			xs[i], ys[i] = s.Minute/60, f(s)
		}
		return slope(xs, ys)
	}
	res.RSSMBPerHour = fit(func(s SoakSample) float64 { return s.RSSMB })
	res.GoroutinesPerHour = fit(func(s SoakSample) float64 { return float64(s.Goroutines) })
	res.PGConnsPerHour = fit(func(s SoakSample) float64 { return float64(s.PGConns) })
	res.RowsPerInteractionSlope = fit(func(s SoakSample) float64 { return s.RowsPerInteraction })
}

func sample(ctx context.Context, st *stack, sl *load, start time.Time, window []time.Duration) SoakSample {
	s := SoakSample{Minute: time.Since(start).Minutes(), PGConns: pgConns(ctx, st.dbURL)}
	sl.mu.Lock()
	s.Acked, s.Errors = int64(len(sl.acked)), int64(sl.sent-len(sl.acked))
	sl.mu.Unlock()
	sort.Slice(window, func(i, j int) bool { return window[i] < window[j] })
	if len(window) > 0 {
		s.P50MS = float64(window[len(window)/2]) / 1e6
		s.P99MS = float64(window[len(window)*99/100]) / 1e6
	}
	m := metrics(st.gatewayAddr, "process_resident_memory_bytes", "go_goroutines")
	s.RSSMB, s.Goroutines = m["process_resident_memory_bytes"]/1e6, int(m["go_goroutines"])
	if conn, err := pgx.Connect(ctx, st.dbURL); err == nil {
		var rows, interactions float64
		// n_live_tup is the statistics collector's estimate, kept current
		// by autovacuum's analyze; exact counts would scan every table.
		if conn.QueryRow(ctx, `SELECT (SELECT sum(n_live_tup) FROM pg_stat_user_tables),
			(SELECT n_live_tup FROM pg_stat_user_tables WHERE relname = 'interactions')`).Scan(&rows, &interactions) == nil && interactions > 0 {
			s.RowsPerInteraction = rows / interactions
		}
		conn.Close(ctx)
	}
	return s
}

// metrics reads the named unlabelled metrics from a gateway's /metrics.
func metrics(addr string, names ...string) map[string]float64 {
	out := map[string]float64{}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		for _, n := range names {
			if v, ok := strings.CutPrefix(sc.Text(), n+" "); ok {
				out[n], _ = strconv.ParseFloat(v, 64)
			}
		}
	}
	return out
}

// slope is the least-squares slope of ys over xs (0 for fewer than 2).
func slope(xs, ys []float64) float64 {
	n := float64(len(xs))
	if n < 2 {
		return 0
	}
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx, sy, sxx, sxy = sx+xs[i], sy+ys[i], sxx+xs[i]*xs[i], sxy+xs[i]*ys[i]
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / d
}
