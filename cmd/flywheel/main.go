// Command flywheel is the Flywheel binary: gateway, worker, migrations, keys,
// benchmarks and sandbox tools. It only wires packages together.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/internal/telemetry"
)

type command struct {
	summary string
	run     func(ctx context.Context, args []string) error
}

// commands is the top-level command table.
var commands = map[string]command{
	"up":             {"run gateway + worker on the local services, printing URLs and a ready API key", runUp},
	"gateway":        {"run the HTTP gateway", runGateway},
	"worker":         {"run a Temporal worker", runWorker},
	"model-server":   {"serve the in-process policy in vLLM's HTTP dialect", runModelServer},
	"trainer-server": {"serve the in-process policy's trainer behind the Tinker training API", runTrainerServer},
	"migrate":        {"apply (up), roll back (down --to N) or show (status) the schema", runMigrate},
	"keys":           {"API keys: keys create|list|revoke|rotate", runKeys},
	"usage":          {"calls and tokens per tenant, key and deployment: usage [--tenant T] [--key ID] [--since D] [--by-day]", runUsage},
	"deployments":    {"deployments create|update|list|show: the models the gateway serves", runDeployments},
	"temporal":       {"temporal setup: register the namespace and search attributes", runTemporal},
	"bench":          {"whole-system benchmarks: bench NAME", runBench},
	"export":         {"export a tenant's trajectories as ATDP JSONL or Parquet: export --tenant NAME [--format jsonl|parquet] [--out FILE]", runExport},
	"sandbox":        {"sandbox build|tasks|janitor|rollout: build the images, list the shipped tasks, remove leftovers, start a task's rollouts", runSandbox},
	"demo":           {"demo agents on the built-in task (--offline: in process)", runDemo},
	"version":        {"print the version", runVersion},
	"session":        {"session show ID | list: a SessionWorkflow's state", runSessionCmd},
	"release":        {"release start|show|list|approve|abort: gated releases", runReleaseCmd},
	"train":          {"train now|show --deployment D: the TrainingWorkflow", runTrainCmd},
	"evolve":         {"evolve now|schedule|list --deployment D: evolution decisions", runEvolveCmd},
	"forget":         {"forget retire REQUEST_ID: retire versions trained on forgotten data", runForgetCmd},
	"suite":          {"suite set|show|list|delete --deployment D: the held-out and safety suites the gates and the watchdog answer", runSuite},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	shutdown, err := telemetry.Setup(ctx, "flywheel", version())
	if err != nil {
		fmt.Fprintln(os.Stderr, "flywheel:", err)
		os.Exit(1)
	}
	err = run(ctx, os.Args[1:])
	flush, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = shutdown(flush)
	cancel()
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "flywheel:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage()
		return nil
	}
	cmd, ok := commands[args[0]]
	if !ok {
		usage()
		return fmt.Errorf("unknown command %q", args[0])
	}
	return cmd.run(ctx, args[1:])
}

func usage() {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("usage: flywheel COMMAND [flags]\n\ncommands:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  %-9s %s\n", n, commands[n].summary)
	}
	b.WriteString("\nEvery command takes the configuration flags (see `flywheel gateway -h`);\n" +
		"each flag is also an env var FLYWHEEL_* and a key in the --config YAML file.\n")
	fmt.Fprint(os.Stderr, b.String())
}

// loadConfig parses args into the configuration, after letting the caller
// register its own flags on the same set.
func loadConfig(name string, args []string, own func(fs *flag.FlagSet)) (config.Config, *flag.FlagSet, error) {
	cfg := config.Default()
	fs := flag.NewFlagSet("flywheel "+name, flag.ContinueOnError)
	path := config.Bind(fs, &cfg)
	if own != nil {
		own(fs)
	}
	if err := parseInterleaved(fs, args); err != nil {
		return cfg, fs, err
	}
	if err := config.Load(fs, &cfg, *path); err != nil {
		return cfg, fs, fmt.Errorf("configuration: %w", err)
	}
	return cfg, fs, nil
}

// parseInterleaved parses flags that may follow positional arguments
// (`keys revoke 12 --grace 1h`), which the flag package alone stops at;
// after "--" everything is positional. fs.Args() is the positionals.
func parseInterleaved(fs *flag.FlagSet, args []string) error {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if i := len(args) - len(rest) - 1; i >= 0 && args[i] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	return fs.Parse(append([]string{"--"}, pos...))
}

func newLogger(c config.LogConfig) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.Level)) // validated by config
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

// version is the module version the go tool stamps (with the VCS revision
// and "+dirty" when built from a checkout), or the bare revision when only
// that is known.
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := info.Main.Version
	if v == "" || v == "(devel)" {
		v = "devel"
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += " " + s.Value[:12]
			}
		}
	}
	return v + " " + info.GoVersion
}

func runVersion(ctx context.Context, args []string) error {
	fmt.Println("flywheel", version())
	return nil
}
