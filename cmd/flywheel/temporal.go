package main

import (
	"context"
	"fmt"
	"time"

	"github.com/flywheel-ai/flywheel/worker"
)

func runTemporal(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "setup" {
		return fmt.Errorf("usage: flywheel temporal setup")
	}
	cfg, _, err := loadConfig("temporal setup", args[1:], nil)
	if err != nil {
		return err
	}
	logger := newLogger(cfg.Log)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c, err := worker.Dial(ctx, cfg.Temporal.Address, cfg.Temporal.Namespace, logger)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := worker.Setup(ctx, c, cfg.Temporal.Namespace); err != nil {
		return err
	}
	fmt.Printf("namespace %s ready with Flywheel search attributes\n", cfg.Temporal.Namespace)
	return nil
}
