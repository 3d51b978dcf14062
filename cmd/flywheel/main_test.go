package main

import (
	"context"
	"flag"
	"io"
	"testing"
	"time"

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
	for _, args := range [][]string{{"release"}, {"sandbox"}, {"bench"}, {"keys"}, {"keys", "nope"}, {"deployments"}, {"deployments", "nope"}, {"sandbox", "nope"}, {"bench", "nope"}, {"temporal"}, {"temporal", "nope"}} {
		err := run(ctx, args)
		require.Error(t, err, args)
		require.NotErrorIs(t, err, flag.ErrHelp, args)
		require.Contains(t, err.Error(), "usage: flywheel ", args)
	}
}

// TestFlagsMayFollowPositionalArguments: `keys rotate 12 --grace 1h` parses
// the flag after the id; after "--" everything is positional.
func TestFlagsMayFollowPositionalArguments(t *testing.T) {
	for _, c := range []struct {
		args  []string
		grace time.Duration
		pos   []string
	}{
		{[]string{"12", "--grace", "1h"}, time.Hour, []string{"12"}},
		{[]string{"--grace=2h", "12"}, 2 * time.Hour, []string{"12"}},
		{[]string{"a", "--grace", "3h", "b"}, 3 * time.Hour, []string{"a", "b"}},
		{[]string{"a", "--", "--grace", "b"}, 0, []string{"a", "--grace", "b"}},
		{nil, 0, nil},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		grace := fs.Duration("grace", 0, "")
		require.NoError(t, parseInterleaved(fs, c.args), c.args)
		require.Equal(t, c.grace, *grace, c.args)
		if c.pos == nil {
			require.Empty(t, fs.Args())
		} else {
			require.Equal(t, c.pos, fs.Args(), c.args)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	require.Error(t, parseInterleaved(fs, []string{"12", "--nope"}), "an unknown flag after a positional is still an error")
}
