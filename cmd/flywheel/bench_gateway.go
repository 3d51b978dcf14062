package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flywheel-ai/flywheel/gateway/gatewaybench"
	"github.com/flywheel-ai/flywheel/store"
)

func init() {
	benchCommands["gateway"] = func(ctx context.Context, args []string) error {
		bc := gatewaybench.BenchConfig{Out: os.Stdout}
		var cpuProfile string
		cfg, _, err := loadConfig("bench gateway", args, func(fs *flag.FlagSet) {
			fs.DurationVar(&bc.UpstreamLatency, "upstream-latency", 5*time.Millisecond, "fixed latency of the local vLLM-like upstream")
			fs.IntVar(&bc.RPS, "rps", 1000, "rate of the fixed-rate phase")
			fs.DurationVar(&bc.Duration, "duration", 8*time.Second, "length of the fixed-rate phase per system")
			fs.IntVar(&bc.Concurrency, "concurrency", 64, "clients in the maximum-throughput phase")
			fs.DurationVar(&bc.MaxDuration, "max-duration", 4*time.Second, "length of the maximum-throughput phase per system")
			fs.IntVar(&bc.CaptureWriters, "capture-writers", 256, "concurrent writers in the capture phase (both methods share one 64-connection pool)")
			fs.BoolVar(&bc.CaptureOnly, "capture-only", false, "run only the capture phase")
			fs.DurationVar(&bc.CaptureDuration, "capture-duration", 3*time.Second, "length of each capture measurement")
			fs.IntVar(&bc.CaptureConversationKB, "capture-conversation-kb", 0, "size of each captured row's conversation in kB, with a prompt token id per 4 bytes (0: a one-line chat)")
			fs.IntVar(&bc.Rounds, "rounds", 3, "rounds of the throughput and capture phases, alternating the systems; figures are medians")
			fs.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file (samples carry a \"system\" label: upstream, baseline, gateway)")
		})
		if err != nil {
			return err
		}
		// A scratch database, migrated, dropped at the end: the benchmark
		// never writes into real data.
		url, drop, err := scratchDatabase(ctx, cfg.Database.URL)
		if err != nil {
			return fmt.Errorf("bench gateway: %w", err)
		}
		defer drop()
		pool, err := store.Open(ctx, url, 64)
		if err != nil {
			return err
		}
		defer pool.Close()
		bc.Pool = pool
		if cpuProfile != "" {
			f, err := os.Create(cpuProfile)
			if err != nil {
				return fmt.Errorf("bench gateway: %w", err)
			}
			defer f.Close()
			if err := pprof.StartCPUProfile(f); err != nil {
				return fmt.Errorf("bench gateway: cpu profile: %w", err)
			}
			defer pprof.StopCPUProfile()
		}
		res, err := gatewaybench.RunBench(ctx, bc)
		if err != nil {
			return fmt.Errorf("bench gateway: %w", err)
		}
		out, _ := json.Marshal(res)
		fmt.Println(string(out))
		return nil
	}
}

// scratchDatabase creates and migrates a database next to the one url
// names, and returns its URL and a function dropping it.
func scratchDatabase(ctx context.Context, url string) (string, func(), error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", nil, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	name := fmt.Sprintf("flywheel_bench_%d", time.Now().UnixNano())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", nil, fmt.Errorf("create scratch database: %w", err)
	}
	base, query, _ := strings.Cut(url, "?")
	scratch := base[:strings.LastIndex(base, "/")+1] + name
	if query != "" {
		scratch += "?" + query
	}
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			fmt.Fprintf(os.Stderr, "drop scratch database %s: %v\n", name, err)
			return
		}
		defer c.Close(ctx)
		// FORCE is refused to a non-superuser while an autovacuum worker
		// (started by the benchmark's writes) is in the database; a plain
		// DROP cancels that worker itself, so it is the fallback.
		drop := "DROP DATABASE IF EXISTS " + pgx.Identifier{name}.Sanitize()
		if _, err := c.Exec(ctx, drop+" WITH (FORCE)"); err != nil {
			if _, err2 := c.Exec(ctx, drop); err2 != nil {
				fmt.Fprintf(os.Stderr, "drop scratch database %s: %v; %v\n", name, err, err2)
			}
		}
	}
	if err := migrateUp(ctx, scratch); err != nil {
		drop()
		return "", nil, err
	}
	return scratch, drop, nil
}
