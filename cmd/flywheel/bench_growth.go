package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/flywheel-ai/flywheel/gateway/gatewaybench"
	"github.com/flywheel-ai/flywheel/store"
)

func init() {
	benchCommands["session-growth"] = func(ctx context.Context, args []string) error {
		gc := gatewaybench.GrowthConfig{Out: os.Stdout}
		cfg, _, err := loadConfig("bench session-growth", args, func(fs *flag.FlagSet) {
			fs.IntVar(&gc.Turns, "turns", 50, "turns of the agent session")
			fs.IntVar(&gc.TurnKB, "turn-kb", 30, "tool output added to the conversation each turn, in kB")
		})
		if err != nil {
			return err
		}
		url, drop, err := scratchDatabase(ctx, cfg.Database.URL)
		if err != nil {
			return fmt.Errorf("bench session-growth: %w", err)
		}
		defer drop()
		pool, err := store.Open(ctx, url, 8)
		if err != nil {
			return err
		}
		defer pool.Close()
		gc.Pool = pool
		res, err := gatewaybench.RunGrowth(ctx, gc)
		if err != nil {
			return fmt.Errorf("bench session-growth: %w", err)
		}
		out, _ := json.Marshal(res)
		fmt.Println(string(out))
		return nil
	}
}
