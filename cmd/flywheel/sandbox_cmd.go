package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/flywheel-ai/flywheel/sandbox"
)

// runSandbox implements `flywheel sandbox SUBCOMMAND`.
func runSandbox(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: flywheel sandbox {build|janitor} [flags]")
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	switch args[0] {
	case "build":
		return runSandboxBuild(ctx, args[1:], log)
	default:
		return fmt.Errorf("unknown sandbox subcommand %q (have: build, janitor)", args[0])
	}
}

func runSandboxBuild(ctx context.Context, args []string, log *slog.Logger) error {
	fs := flag.NewFlagSet("sandbox build", flag.ContinueOnError)
	registry := fs.String("registry-image", os.Getenv("FLYWHEEL_SANDBOX_REGISTRY_IMAGE"), "use this image when it is present or can be pulled, instead of building the base image")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cli, err := sandbox.Connect(ctx)
	if err != nil {
		return err
	}
	defer cli.Close()
	start := time.Now()
	img, err := sandbox.EnsureBaseImage(ctx, cli, sandbox.BaseImageOptions{RegistryImage: *registry, Logger: log})
	if err != nil {
		return err
	}
	fmt.Printf("base image %s (built=%v, %s)\n", img.Ref, img.Built, time.Since(start).Round(time.Millisecond))
	return nil
}
