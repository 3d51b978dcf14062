package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/flywheel-ai/flywheel/internal/faults"
)

func init() {
	benchCommands["faults"] = func(ctx context.Context, args []string) error {
		fc := faults.Config{Out: os.Stdout}
		var list string
		_, _, err := loadConfig("bench faults", args, func(fs *flag.FlagSet) {
			fs.StringVar(&list, "faults", strings.Join(faults.All, ","), "faults to inject, in order")
			fs.IntVar(&fc.Clients, "clients", 16, "concurrent agents, each in 4-call sessions, no retries")
			fs.DurationVar(&fc.Think, "think", 50*time.Millisecond, "each agent's pause between calls")
			fs.DurationVar(&fc.Before, "before", 5*time.Second, "load before each fault")
			fs.DurationVar(&fc.After, "after", 5*time.Second, "load after each fault's end")
			fs.DurationVar(&fc.Outage, "outage", 10*time.Second, "how long a stopped service stays down")
			fs.DurationVar(&fc.Settle, "settle", 90*time.Second, "how long every session's workflow may take to appear, and training to settle after trainer-kill")
			fs.DurationVar(&fc.SWESettle, "swe-settle", 5*time.Minute, "how long the rollout of swe-kill may take to end after the restart")
			fs.StringVar(&fc.TemporalCLI, "temporal-cli", os.Getenv("FLYWHEEL_TEMPORAL_CLI"), "the temporal CLI whose dev server the run starts (env FLYWHEEL_TEMPORAL_CLI; make services builds it)")
			fs.BoolVar(&fc.Keep, "keep", false, "leave the run's directory (logs, data) under /var/tmp")
		})
		if err != nil {
			return err
		}
		if fc.TemporalCLI == "" {
			return fmt.Errorf("bench faults: --temporal-cli is required (eval \"$(scripts/services.sh env)\" sets FLYWHEEL_TEMPORAL_CLI)")
		}
		if fc.Bin, err = os.Executable(); err != nil {
			return err
		}
		fc.Faults = strings.Split(list, ",")
		res, err := faults.Run(ctx, fc)
		if err != nil {
			return fmt.Errorf("bench faults: %w", err)
		}
		fmt.Print(faults.Table(res))
		out, _ := json.Marshal(res)
		fmt.Println(string(out))
		return nil
	}

	benchCommands["soak"] = func(ctx context.Context, args []string) error {
		sc := faults.SoakConfig{Out: os.Stdout}
		_, _, err := loadConfig("bench soak", args, func(fs *flag.FlagSet) {
			fs.DurationVar(&sc.Duration, "duration", 20*time.Minute, "length of the soak")
			fs.DurationVar(&sc.Sample, "sample", 30*time.Second, "time between samples")
			fs.Float64Var(&sc.Load, "load", 0.5, "share of the measured capacity offered, open loop")
			fs.DurationVar(&sc.Capacity, "capacity", 15*time.Second, "length of the closed-loop capacity measurement")
			fs.IntVar(&sc.CapacityClients, "capacity-clients", 32, "agents in the capacity measurement")
			fs.StringVar(&sc.TemporalCLI, "temporal-cli", os.Getenv("FLYWHEEL_TEMPORAL_CLI"), "the temporal CLI whose dev server the run starts (env FLYWHEEL_TEMPORAL_CLI)")
			fs.BoolVar(&sc.Keep, "keep", false, "leave the run's directory (logs, data) under /var/tmp")
		})
		if err != nil {
			return err
		}
		if sc.TemporalCLI == "" {
			return fmt.Errorf("bench soak: --temporal-cli is required (eval \"$(scripts/services.sh env)\" sets FLYWHEEL_TEMPORAL_CLI)")
		}
		if sc.Bin, err = os.Executable(); err != nil {
			return err
		}
		res, err := faults.RunSoak(ctx, sc)
		if err != nil {
			return fmt.Errorf("bench soak: %w", err)
		}
		out, _ := json.Marshal(res)
		fmt.Println(string(out))
		return nil
	}
}
