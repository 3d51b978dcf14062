package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
)

// benchCommands are the whole-system benchmarks under `flywheel bench NAME`.
// Each prints human-readable progress and, as its last line, one JSON object
// of figures (ratios against a baseline measured in the same run).
var benchCommands = map[string]func(ctx context.Context, args []string) error{}

func runBench(ctx context.Context, args []string) error {
	names := make([]string, 0, len(benchCommands))
	for n := range benchCommands {
		names = append(names, n)
	}
	sort.Strings(names)
	usage := fmt.Sprintf("flywheel bench {%s} [flags]", strings.Join(names, "|"))
	name, rest, err := verb(args, usage)
	if err != nil {
		return err
	}
	run, ok := benchCommands[name]
	if !ok {
		return fmt.Errorf("unknown benchmark %q; usage: %s", name, usage)
	}
	return run(ctx, rest)
}
