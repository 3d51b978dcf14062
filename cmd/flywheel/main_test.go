package main

import (
	"context"
	"flag"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHelpExitsCleanly: every command answers -h with its usage and
// flag.ErrHelp (exit 0), and a bare or unknown subcommand with an error
// that says the usage (exit 1).
func TestHelpExitsCleanly(t *testing.T) {
	ctx := context.Background()
	for name := range commands {
		if name == "version" {
			continue
		}
		t.Run(name, func(t *testing.T) {
			require.ErrorIs(t, run(ctx, []string{name, "-h"}), flag.ErrHelp)
		})
	}
	for _, args := range [][]string{{"release"}, {"sandbox"}, {"bench"}, {"keys"}, {"keys", "list"}, {"sandbox", "nope"}, {"bench", "nope"}, {"temporal"}, {"temporal", "nope"}} {
		err := run(ctx, args)
		require.Error(t, err, args)
		require.NotErrorIs(t, err, flag.ErrHelp, args)
		require.Contains(t, err.Error(), "usage: flywheel ", args)
	}
}
