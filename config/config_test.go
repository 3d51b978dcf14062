package config

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// clearEnv hides the caller's FLYWHEEL_* variables (make test sets some)
// for the duration of t.
func clearEnv(t *testing.T) {
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, EnvPrefix) {
			t.Setenv(name, "")
			require.NoError(t, os.Unsetenv(name))
		}
	}
}

func load(t *testing.T, args []string, yamlText string) (Config, error) {
	t.Helper()
	cfg := Default()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	path := Bind(fs, &cfg)
	require.NoError(t, fs.Parse(args))
	if yamlText != "" {
		*path = filepath.Join(t.TempDir(), "flywheel.yaml")
		require.NoError(t, os.WriteFile(*path, []byte(yamlText), 0o600))
	}
	return cfg, Load(fs, &cfg, *path)
}

func TestPrecedenceDefaultsYAMLEnvFlags(t *testing.T) {
	clearEnv(t)
	t.Setenv("FLYWHEEL_TEMPORAL_NAMESPACE", "from-env")
	t.Setenv("FLYWHEEL_GATEWAY_READ_TIMEOUT", "7s")
	cfg, err := load(t, []string{"--gateway-read-timeout=9s", "--worker-task-queues=a, b"}, `
temporal:
  namespace: from-yaml
  address: 10.0.0.1:7233
gateway:
  read_timeout: 3s
log:
  level: debug
`)
	require.NoError(t, err)
	require.Equal(t, "10.0.0.1:7233", cfg.Temporal.Address, "yaml beats default")
	require.Equal(t, "from-env", cfg.Temporal.Namespace, "env beats yaml")
	require.Equal(t, 9*time.Second, cfg.Gateway.ReadTimeout, "flag beats env and yaml")
	require.Equal(t, []string{"a", "b"}, cfg.Worker.TaskQueues)
	require.Equal(t, "debug", cfg.Log.Level)
	require.Equal(t, Default().Database.URL, cfg.Database.URL, "untouched default stays")
}

func TestUnknownYAMLKeyIsAnError(t *testing.T) {
	clearEnv(t)
	_, err := load(t, nil, "gatway:\n  listen: x\n")
	require.ErrorContains(t, err, "gatway")
}

func TestBadEnvValueNamesTheVariable(t *testing.T) {
	clearEnv(t)
	t.Setenv("FLYWHEEL_DATABASE_MAX_CONNS", "lots")
	_, err := load(t, nil, "")
	require.ErrorContains(t, err, "FLYWHEEL_DATABASE_MAX_CONNS")
	require.ErrorContains(t, err, "integer")
}

func TestValidateReportsEveryProblem(t *testing.T) {
	cfg := Default()
	cfg.Database.URL = "mysql://x"
	cfg.Temporal.Address = "nope"
	cfg.Log.Level = "loud"
	err := cfg.Validate()
	require.ErrorContains(t, err, "--database-url")
	require.ErrorContains(t, err, "--temporal-address")
	require.ErrorContains(t, err, "--log-level")
}

func TestDefaultAdminKeyRefusedOffLoopback(t *testing.T) {
	cfg := Default()
	cfg.Gateway.Listen = "0.0.0.0:8080"
	require.ErrorContains(t, cfg.Validate(), "--gateway-admin-key")
	cfg.Gateway.Listen = "[::1]:8080"
	require.NoError(t, cfg.Validate())
	cfg.Gateway.Listen = ":8080"
	require.Error(t, cfg.Validate(), "empty host listens on every interface")
	cfg.Gateway.AdminKey = "a-long-production-admin-key"
	require.NoError(t, cfg.Validate())
}

func TestRateLimitSettingsAreValidated(t *testing.T) {
	cfg := Default()
	require.Equal(t, 1, cfg.Gateway.Replicas)
	require.Zero(t, cfg.Gateway.RateLimitTPM, "no token rate limit unless configured")
	cfg.Gateway.RateLimitTPM = -5
	cfg.Gateway.Replicas = 0
	err := cfg.Validate()
	require.ErrorContains(t, err, "--gateway-rate-limit-tpm: want 0 (off) or a positive number of tokens per minute, got -5")
	require.ErrorContains(t, err, "--gateway-replicas: want 1..1000 gateway replicas, got 0")
}
